"""The "Add a trial kind" recipe of docs/development.md, executed.

The section's module is written into a temporary package, with its trial and sweep files and
a tiny collection of the test's own in place of NFCorpus; the kind is registered as the
recipe says (``register_kind``, what its registry line does at import), and the section's
``orchestrate`` commands run through the command line's entry point, in this process. A
recipe that drifts from the code fails here, and so does a command that names the kinds it
knows instead of asking the registry (``runs --kind`` with a hard-coded list, a sweep grid
or a trial file read by kind name).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from importlib import import_module
from pathlib import Path

import pytest

import workloads.kinds.registry
from orchestrator.core.config import load_trials
from tests.helpers import run_cli
from workloads.kinds import TRIAL_KINDS, kind_named, register_kind, run_in_process

RECIPE = Path(__file__).resolve().parents[1] / "docs" / "development.md"
SECTION = "## Add a trial kind"
KIND_MODULE = "workloads/kinds/overlap/kind.py"  # where the recipe puts its module
PACKAGE = "overlap_recipe_kind"  # the temporary package it is written to here
STAND_IN = "beir/nfcorpus"  # the recipe's collection, replaced by the tiny one below
# What the kind's registry line does in every process, done in each Ray worker as it starts:
# once both workloads.kinds and the kind's module are imported there, whichever comes first
# (most of Ray's processes import neither: no cost there).
WORKER_HOOK = f'''import importlib.abc
import importlib.util
import sys

WATCHED = {{"workloads.kinds", "{PACKAGE}.kind"}}


def register_when_ready():
    kinds, kind = sys.modules.get("workloads.kinds"), sys.modules.get("{PACKAGE}.kind")
    if kinds is None or not hasattr(kinds, "register_kind"):
        return  # workloads.kinds not imported yet, or still importing
    if kind is None:
        import {PACKAGE}.kind as kind
    if hasattr(kind, "KIND") and kind.KIND.name not in kinds.TRIAL_KINDS:  # (no KIND yet: still importing)
        kinds.register_kind(kind.KIND)


class AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WATCHED:
            return None
        WATCHED.discard(name)
        spec = importlib.util.find_spec(name)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            register_when_ready()

        spec.loader.exec_module = exec_module
        return spec


def register():
    sys.meta_path.insert(0, AfterImport())
    register_when_ready()
'''

DOCUMENTS = ["solar panels convert sunlight into electricity", "wind turbines generate electricity from wind",
             "a long page on sunlight and wind and water and rivers and mountains and electricity and more",
             "rivers carry water to the sea", "mountains are formed by tectonic plates", "water boils at one hundred degrees",
             "plates of food on the table", "a long text on the sea the sea and mountains rivers sunlight wind food plates"]
QUERIES = {"q1": "sunlight electricity", "q2": "wind electricity", "q3": "water sea", "q4": "tectonic plates mountains",
           "q5": "boiling water", "q6": "food plates"}
SPLITS = {"train": {"q1": "d0"}, "dev": {"q2": "d1", "q3": "d3"}, "test": {"q4": "d4", "q5": "d5", "q6": "d6"}}


def recipe_blocks() -> list[tuple[str, str]]:
    """The section's fenced blocks as (language, text), in order."""
    text = RECIPE.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end != -1 else None]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, flags=re.S | re.M)


def recipe_files() -> dict[str, str]:
    """The blocks whose first line names a file (``# path``): path -> text."""
    files = {}
    for _, body in recipe_blocks():
        first, _, rest = body.partition("\n")
        if re.fullmatch(r"# [\w./-]+\.(py|yaml)", first.strip()):
            files[first.strip()[2:]] = rest
    return files


def recipe_commands() -> list[list[str]]:
    """The section's ``orchestrate`` commands, as argument lists (comments left out)."""
    commands = []
    for language, body in recipe_blocks():
        if language == "bash":
            commands += [shlex.split(line.split("#")[0])[1:] for line in body.splitlines() if line.startswith("orchestrate ")]
    return commands


def write_collection(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n"
                                               for i, text in enumerate(DOCUMENTS)), encoding="utf-8")
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": text}) + "\n" for q, text in QUERIES.items()),
                                        encoding="utf-8")
    for split, judged in SPLITS.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in judged.items()), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The recipe's kind written into a temporary package and registered; its files in ``work``."""
    files = recipe_files()
    assert KIND_MODULE in files, f"{RECIPE.name}: the recipe no longer shows {KIND_MODULE}"
    root = tmp_path_factory.mktemp("recipe")
    package = root / "packages" / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "kind.py").write_text(files.pop(KIND_MODULE), encoding="utf-8")
    (root / "packages" / "register_recipe_kind.py").write_text(WORKER_HOOK, encoding="utf-8")
    collection = write_collection(root / "tiny")
    work = root / "work"
    work.mkdir()
    for name, text in files.items():
        assert STAND_IN in text, f"{name}: the recipe's file no longer reads {STAND_IN}"
        (work / name).write_text(text.replace(STAND_IN, str(collection)), encoding="utf-8")
    sys.path.insert(0, str(root / "packages"))
    kind = import_module(f"{PACKAGE}.kind").KIND
    register_kind(kind)
    yield kind, work, root / "packages"
    TRIAL_KINDS.pop(kind.name, None)
    sys.path.remove(str(root / "packages"))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.") or m == "register_recipe_kind"]:
        del sys.modules[name]


def command(work: Path, args: list[str], as_json: bool = True):
    """One of the recipe's commands, run in ``work`` (with ``--json``: its parsed output; else its text)."""
    result = run_cli(work, *args, *(["--json"] if as_json else []))
    assert result.returncode == 0, f"orchestrate {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout) if as_json else result.stdout


def test_the_recipe_lists_the_commands_it_promises():
    assert [args[0] for args in recipe_commands()] == ["run", "run", "runs", "sweep"]
    assert set(recipe_files()) == {KIND_MODULE, "overlap-nfcorpus.yaml", "overlap-sweep.yaml"}


def test_the_recipe_registers_its_kind_as_every_kind_is_registered():
    """The recipe's registry line names the registry's module and has the shape of each built-in kind's line there."""
    registry = Path(workloads.kinds.registry.__file__).resolve().relative_to(RECIPE.parents[1]).as_posix()
    section = RECIPE.read_text(encoding="utf-8").split(SECTION, 1)[1]
    assert f"`{registry}`" in section, f"the recipe should say the registry is {registry}"
    [line] = [body.split("#")[0].strip() for language, body in recipe_blocks() if language == "python" and "import KIND" in body
              and not body.startswith("# ")]
    source = Path(workloads.kinds.registry.__file__).read_text(encoding="utf-8")
    built_in = [k.name for k in TRIAL_KINDS.values() if k.spec.__module__.startswith("workloads.")]
    assert built_in and all(line.replace("overlap", n).replace("OVERLAP", n.upper()) in source for n in built_in), line


def test_the_recipe_kind_runs_in_process(recipe, tmp_path):
    kind, work, _ = recipe
    assert kind_named("overlap") is kind
    _, specs = _load(work / "overlap-nfcorpus.yaml", kind)
    prepared, epochs, tested = run_in_process(specs[0], tmp_path / "checkpoints")
    assert [int(e.metrics["epoch"]) for e in epochs] == [1, 2, 3]
    # the length penalty lifts the short relevant documents above the long pages that match every word
    assert epochs[0].metrics["val_ndcg_at_10"] < epochs[1].metrics["val_ndcg_at_10"]
    assert tested.evaluation.num_queries == len(SPLITS["test"])
    assert tested.evaluation.aggregate["ndcg_at_10"] > prepared.first_stage_test.aggregate["ndcg_at_10"]


def _load(path: Path, kind):
    return load_trials(path, kind.spec)


def test_a_new_kind_goes_through_the_dry_runs(recipe):
    """`run --dry-run` and `sweep --dry-run` of the recipe's files: the kind's file, identity,
    grid and search, each found through the registry."""
    kind, work, _ = recipe
    dry_runs = [args for args in recipe_commands() if "--dry-run" in args]
    assert [args[0] for args in dry_runs] == ["run", "sweep"]
    planned = command(work, dry_runs[0])
    _, specs = _load(work / "overlap-nfcorpus.yaml", kind)
    [trial] = planned["trials"]
    assert trial["trial_key"] == kind.key(specs[0])
    assert trial["config"]["kind"] == "overlap" and trial["would_stop"] == []
    swept = command(work, dry_runs[1])
    assert (swept["cells"], swept["trials_per_cell"], swept["trials_to_run"]) == (1, 2, 2)
    assert swept["preflight"] == []
    for args in dry_runs:  # as the recipe writes them: the text a person reads
        assert "overlap" in command(work, args, as_json=False)


@pytest.mark.slow
def test_a_new_kind_runs_as_ray_train_workers_and_is_listed(recipe, monkeypatch):
    """The recipe's `run` for real (Ray Train workers, MLflow) and `runs --kind overlap` after it."""
    import ray

    kind, work, packages = recipe
    real_init = ray.init

    def init_with_the_kind(*args, runtime_env=None, **kwargs):  # every worker registers the kind, as its registry line would
        runtime_env = dict(runtime_env or {})
        path = os.pathsep.join(filter(None, [str(packages), os.environ.get("PYTHONPATH")]))
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), "PYTHONPATH": path}
        runtime_env["worker_process_setup_hook"] = "register_recipe_kind.register"
        return real_init(*args, runtime_env=runtime_env, **kwargs)

    if ray.is_initialized():  # a Ray an earlier test left has workers that do not know the kind
        ray.shutdown()
    monkeypatch.setattr(ray, "init", init_with_the_kind)
    run, listed = [args for args in recipe_commands() if "--dry-run" not in args]
    assert run[0] == "run" and listed[:2] == ["runs", "overlap-nfcorpus.yaml"]
    trained = command(work, run)
    assert trained["reused"] is False and trained["best_epoch"] in (2, 3)
    runs = command(work, listed)["runs"]
    assert [(r["kind"], r["status"], r["run_id"]) for r in runs] == [(kind.run_kind, "FINISHED", trained["mlflow_run_id"])]
    assert runs[0]["test_ndcg_at_10"] == pytest.approx(trained["test"]["model"]["ndcg_at_10"])
    again = command(work, run, as_json=False)  # found by its identity, not trained again; printed as a person reads it
    assert f"MLflow run {trained['mlflow_run_id']}" in again and "[reused]" in again
