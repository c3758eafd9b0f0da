"""The promise on bad input, case by case: one ``error:`` line naming the file or option and the
problem, exit code 2, no traceback, nothing written; hangs become errors within seconds; commands
that only read write nothing; the first-use conveniences a new user looks for."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import build_parser
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import load_sweep
from orchestrator.sweep.store import bind_store, sweep_paths
from tests.helpers import free_port, run_cli

REPO = Path(__file__).resolve().parents[2]
SCIFACT = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "scifact"
READ_ONLY = Path("/sys/rerank-lab-test")  # not writable, even as root


def cli(cwd: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return run_cli(cwd, *args, timeout=timeout)  # in process: these are the command's answers, not the interpreter's


def one_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert all(text in lines[0] for text in expected), lines[0]
    return lines[0]


def files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture()
def tiny_beir(tmp_path):
    """A 3-document BEIR directory the tests spoil one way or another."""
    root = tmp_path / "tiny"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "cats purr"}\n{"_id": "d2", "text": "dogs bark"}\n'
                                       '{"_id": "d3", "text": "fish swim"}\n')
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "what purrs"}\n{"_id": "q2", "text": "who barks"}\n')
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return root


def _sweep_file(tmp_path: Path, name: str = "s", **changes) -> Path:
    config = {"name": name, "base": {"data": {"collection": "beir/scifact"}},
              "grid": {"models": ["minilm-l6"], "losses": [{"ranking": "pointwise"}], "augmentations": [{"method": "none"}],
                       "sizes": [100]},
              "search": {"trials_per_cell": 1}, **changes}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ----------------------------------------------------------------------------- first stage


@pytest.mark.parametrize("args, message", [
    (["--k1", "-1"], "argument --k1: -1 is out of range"),
    (["--b", "7"], "argument --b: 7 is out of range"),
    (["--b", "nan"], "argument --b: 'nan' is not a finite number"),
    (["--k", "0"], "argument --k: 0 is out of range"),
    (["--k", "-5"], "argument --k: -5 is out of range"),
])
def test_bm25_parameters_are_checked(tmp_path, args, message):
    one_line(cli(tmp_path, "bm25", "--dataset", "beir/scifact", *args), message)
    assert not (tmp_path / ".orchestrate").exists()


def test_a_query_without_text_is_one_line_not_anserinis_silence(tmp_path, tiny_beir):
    (tiny_beir / "queries.jsonl").write_text('{"_id": "q1", "text": "what purrs"}\n{"_id": "q2", "text": "  "}\n')
    one_line(cli(tmp_path, "bm25", "--dataset", str(tiny_beir)), "1 queries have no text (e.g. 'q2')")


def test_a_duplicate_document_id_is_refused(tmp_path, tiny_beir):
    with open(tiny_beir / "corpus.jsonl", "a") as corpus:
        corpus.write('{"_id": "d2", "text": "another text"}\n')
    one_line(cli(tmp_path, "bm25", "--dataset", str(tiny_beir)), "corpus.jsonl", "document 'd2' appears twice")


def test_a_query_id_given_twice_with_two_texts_is_refused(tmp_path, tiny_beir):
    with open(tiny_beir / "queries.jsonl", "a") as queries:
        queries.write('{"_id": "q1", "text": "what meows"}\n')
    one_line(cli(tmp_path, "bm25", "--dataset", str(tiny_beir)), "queries.jsonl", "query 'q1' appears twice")
    assert not (tmp_path / ".orchestrate").exists()


def test_run_dry_run_refuses_a_target_that_shares_queries_with_training(tmp_path, tiny_beir):
    (tiny_beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    (tiny_beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq3\td3\t1\n")
    config = {"name": "t", "data": {"collection": str(tiny_beir), "train_split": "train", "validation_split": "dev"},
              "model": {"name": "minilm-l6"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(config))
    one_line(cli(tmp_path, "run", "t.yaml", "--dry-run"), "t.yaml: trial t", "shares 1 queries with the training split 'train'",
             "a test must be held out")
    assert not (tmp_path / ".orchestrate").exists()


def test_a_run_file_that_is_not_utf8_is_one_line(tmp_path):
    run_file = tmp_path / "run.trec"
    run_file.write_bytes(b"q1 Q0 d\xff1 1 2.0 x\n")
    config = {"name": "t", "data": {"collection": "beir/scifact", "validation_queries": 5},
              "first_stage": {"method": "run", "path": str(run_file)}, "model": {"name": "minilm-l6"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(config))
    one_line(cli(tmp_path, "run", "t.yaml", "--storage", str(tmp_path / "ray")), "run.trec", "not UTF-8 text")


# ----------------------------------------------------------------------------- configuration files


def test_a_yaml_that_is_not_utf8_names_its_line(tmp_path):
    (tmp_path / "t.yaml").write_bytes(b"name: t\ndata: {collection: beir/scifact}\nmodel: {name: caf\xe9}\n")
    one_line(cli(tmp_path, "run", "t.yaml", "--dry-run"), "t.yaml:3: not UTF-8 text")


def test_a_key_set_twice_names_both_lines(tmp_path):
    (tmp_path / "t.yaml").write_text("name: t\ndata: {collection: beir/scifact}\nmodel: {name: minilm-l6}\n"
                                     "optimization:\n  batch_size: 8\n  epochs: 1\n  batch_size: 4096\n")
    one_line(cli(tmp_path, "run", "t.yaml", "--dry-run"), "t.yaml:7: optimization.batch_size: set twice (first at line 5)")


def test_trials_that_are_not_a_mapping_of_overrides(tmp_path):
    (tmp_path / "t.yaml").write_text("name: m\nbase:\n  data: {collection: beir/scifact}\n  model: {name: minilm-l6}\n"
                                     "trials:\n  a: 5\n")
    one_line(cli(tmp_path, "run", "t.yaml", "--dry-run"), "t.yaml:6: trials.a: expected a mapping of overrides, got 5")


def test_paths_in_a_yaml_are_relative_to_the_yaml(tmp_path, tiny_beir):
    configs = tmp_path / "configs"
    configs.mkdir()
    config = {"name": "t", "data": {"collection": "../tiny"}, "model": {"name": "minilm-l6"}}
    (configs / "t.yaml").write_text(yaml.safe_dump(config))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    from_root, from_elsewhere = (cli(cwd, "run", str(configs / "t.yaml"), "--dry-run", "--json") for cwd in (tmp_path, elsewhere))
    assert from_root.returncode == from_elsewhere.returncode == 0, from_elsewhere.stderr[-2000:]

    keys = [json.loads(p.stdout)["trials"][0] for p in (from_root, from_elsewhere)]
    assert keys[0]["config"]["data"]["collection"] == str(tiny_beir) == keys[1]["config"]["data"]["collection"]
    assert keys[0]["trial_key"] == keys[1]["trial_key"]  # one spelling, one identity, one cache entry


def test_run_dry_run_prints_the_resolved_trial_and_what_would_stop_it(tmp_path):
    config = {"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "bert-base-not-cached"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(config))
    proc = cli(tmp_path, "run", "t.yaml", "--dry-run")
    assert proc.returncode == 0 and "identity" in proc.stdout and "learning_rate: 0.0001" in proc.stdout
    assert "would stop before it computes: model.name bert-base-not-cached" in proc.stdout
    assert files_under(tmp_path) == {"t.yaml"}


def test_a_cache_or_data_variable_naming_a_file_is_one_line(tmp_path):
    config = {"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "afile").write_text("mine")
    afile = tmp_path / "afile"
    proc = run_cli(tmp_path, "prepare", "t.yaml", env={"ORCHESTRATE_CACHE_DIR": str(afile)})
    assert one_line(proc) == f"error: $ORCHESTRATE_CACHE_DIR: {afile} is not a directory"
    proc = run_cli(tmp_path, "prepare", "t.yaml", env={"ORCHESTRATE_CACHE_DIR": str(afile / "cache")})
    assert one_line(proc) == f"error: $ORCHESTRATE_CACHE_DIR: {afile / 'cache'} is not a directory ({afile} is a file)"
    proc = run_cli(tmp_path, "prepare", "t.yaml", env={"ORCHESTRATE_DATA_DIR": str(afile)})
    assert one_line(proc) == f"error: $ORCHESTRATE_DATA_DIR: {afile} is not a directory"
    proc = run_cli(tmp_path, "run", "t.yaml", "--dry-run", env={"ORCHESTRATE_CACHE_DIR": str(afile)})
    assert proc.returncode == 0, proc.stderr
    assert f"would stop before it computes: $ORCHESTRATE_CACHE_DIR: {afile} is not a directory" in proc.stdout
    assert files_under(tmp_path) == {"t.yaml", "afile"} and afile.read_text() == "mine"


# ----------------------------------------------------------------------------- stores


def test_a_tracking_uri_of_an_unknown_kind(tmp_path):
    one_line(cli(tmp_path, "sweep", str(_sweep_file(tmp_path)), "--tracking-uri", "foo://bar"),
             "foo://bar: not a tracking URI MLflow takes")
    assert files_under(tmp_path) == {"s.yaml"}  # checked before the storage is created


def test_a_tracking_server_that_does_not_answer_fails_within_seconds(tmp_path):
    port = free_port()
    proc = cli(tmp_path, "sweep", str(_sweep_file(tmp_path)), "--tracking-uri", f"http://127.0.0.1:{port}", timeout=60)
    one_line(proc, f"http://127.0.0.1:{port}: no MLflow tracking server answers there")
    assert files_under(tmp_path) == {"s.yaml"}


def test_a_ray_address_that_does_not_answer_fails_within_seconds(tmp_path):
    port = free_port()
    proc = cli(tmp_path, "sweep", str(_sweep_file(tmp_path)), "--address", f"127.0.0.1:{port}", "--tracking-uri",
               f"sqlite:///{tmp_path / 'm.db'}", timeout=60)
    one_line(proc, f"127.0.0.1:{port}: no Ray cluster answers there")
    assert files_under(tmp_path) == {"s.yaml"}  # refused before the MLflow store or the storage is created


def test_a_dry_run_for_a_cluster_of_another_python_is_one_line(tmp_path, monkeypatch):
    setting = tmp_path / "python-version"
    setting.write_text("3.99\n")  # the cluster's Python, as cluster/python-version would say it
    monkeypatch.setattr("orchestrator.core.cluster_python.CLUSTER_PYTHON_FILE", setting)
    proc = cli(tmp_path, "sweep", str(_sweep_file(tmp_path)), "--dry-run", "--address", f"127.0.0.1:{free_port()}", timeout=60)
    one_line(proc, f"cluster/python-version: the cluster runs Python 3.99 but this driver runs Python {sys.version_info[0]}."
                   f"{sys.version_info[1]}", "Ray refuses a driver of another minor version")
    assert files_under(tmp_path) == {"s.yaml", "python-version"}


@pytest.mark.parametrize("name", ["mlflow.db", "optuna.db"])
def test_a_corrupted_store_is_one_line_and_stays_untouched(tmp_path, name):
    sweep = _sweep_file(tmp_path)
    store = tmp_path / "store" / "s"
    store.mkdir(parents=True)
    corrupted = (tmp_path / name) if name == "mlflow.db" else store / name
    corrupted.write_bytes(b"this is not a database" * 100)
    before = corrupted.read_bytes()
    proc = cli(tmp_path, "status", str(sweep), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--storage",
               str(tmp_path / "store"))
    one_line(proc, str(corrupted), "cannot read this")
    assert corrupted.read_bytes() == before


def test_a_read_only_storage_is_one_line(tmp_path):
    proc = cli(tmp_path, "sweep", str(_sweep_file(tmp_path)), "--storage", str(READ_ONLY), "--tracking-uri",
               f"sqlite:///{tmp_path / 'm.db'}")
    one_line(proc, str(READ_ONLY), "cannot write here")
    assert files_under(tmp_path) == {"s.yaml"}  # the storage is checked before the MLflow store is created


def test_status_in_a_directory_without_the_sweeps_stores_says_so_and_writes_nothing(tmp_path):
    sweep = _sweep_file(tmp_path)
    one_line(cli(tmp_path, "status", str(sweep)), "no trace of sweep 's'", "it has not started there")
    one_line(cli(tmp_path, "-v", "status", str(sweep), "--storage", str(READ_ONLY)), "no trace of sweep 's'")
    assert files_under(tmp_path) == {"s.yaml"}
    (tmp_path / "empty.db").write_bytes(b"")  # an empty file is no store: a read leaves it empty
    one_line(cli(tmp_path, "status", str(sweep), "--tracking-uri", f"sqlite:///{tmp_path / 'empty.db'}"), "no trace of sweep 's'")
    assert (tmp_path / "empty.db").stat().st_size == 0


def test_a_dry_run_writes_nothing_and_names_what_would_stop_the_sweep(tmp_path):
    zero_shot = [{"collection": "beir/not-here-anywhere"}]
    sweep = _sweep_file(tmp_path, zero_shot=zero_shot, grid={"models": ["bert-base-not-cached"], "losses": [{"ranking": "pointwise"}],
                                                             "augmentations": [{"method": "none"}], "sizes": [100]})
    proc = cli(tmp_path, "sweep", str(sweep), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "would stop the sweep before it computes: model.name bert-base-not-cached" in proc.stdout
    assert "would stop the sweep before it computes: beir/not-here-anywhere" in proc.stdout
    assert "runnable now: none: 2 problem(s) below would stop the sweep" in proc.stdout  # not counted as runnable
    assert files_under(tmp_path) == {"s.yaml"}


def test_reset_and_runs_never_touch_another_files_sweep_of_the_same_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    owner, other = _sweep_file(tmp_path / "a"), _sweep_file(tmp_path / "b")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sweep = load_sweep(owner)
    paths = sweep_paths(sweep, tmp_path / "store")
    paths.root.mkdir(parents=True)
    (paths.root / "trials.txt").write_text("the owner's work")
    tracker = Tracker(uri)
    experiment_id = tracker.experiment_id(sweep.name)
    bind_store(sweep, paths, tracker, tracker.client.get_experiment(experiment_id))
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri]
    for command in (["reset", str(other), "--yes", *common], ["runs", str(other), "--tracking-uri", uri],
                    ["status", str(other), *common]):
        one_line(cli(tmp_path, *command), str(other), "sweep name 's' is already used", str(owner))
    assert (paths.root / "trials.txt").read_text() == "the owner's work"
    assert tracker.client.get_experiment(experiment_id).lifecycle_stage == "active"


# ----------------------------------------------------------------------------- reports and the UI


def test_report_options_are_checked_before_anything_is_written(tmp_path):
    sweep = _sweep_file(tmp_path)
    one_line(cli(tmp_path, "report", str(sweep), "--digits", "-2"), "argument --digits: -2 is out of range")
    one_line(cli(tmp_path, "report", str(sweep), "--out", str(tmp_path / "out")), "no MLflow store here")
    assert files_under(tmp_path) == {"s.yaml"}


@pytest.mark.parametrize("args, message", [
    (["perturb", "wikiqa", "--show", "-1"], "argument --show: -1 is out of range"),
    (["compare", "a", "b", "--top", "-3"], "argument --top: -3 is out of range"),
    (["ui", "--port", "99999"], "argument --port: 99999 is out of range"),
])
def test_negative_counts_and_impossible_ports(tmp_path, args, message):
    one_line(cli(tmp_path, *args), message)


def test_the_ui_on_a_port_in_use_is_one_line_before_mlflow_starts(tmp_path):
    db = tmp_path / "m.db"
    Tracker(f"sqlite:///{db}").experiment_id("x")  # a store with something to show (an empty file is no store)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line(cli(tmp_path, "ui", "--port", str(port), "--tracking-uri", f"sqlite:///{db}"), f"--port {port}: cannot serve")


# ----------------------------------------------------------------------------- first use


def test_version_and_verbosity_before_the_command():
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("rerank-lab ")
    proc = cli(REPO, "-v", "perturb", "wikiqa", "--show", "0")
    assert proc.returncode == 0 and "punctuation" in proc.stdout


def test_every_option_says_what_it_does_and_its_default():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help text"
        assert "(default: None)" not in " ".join(command.format_help().split()), name
    assert "(default: 1000)" in " ".join(commands["bm25"].format_help().split())
    assert "(default: .orchestrate/sweeps)" in " ".join(commands["sweep"].format_help().split())


def test_unknown_commands_and_options_are_one_line(tmp_path):
    one_line(cli(tmp_path, "sweeep"), "invalid choice: 'sweeep'")
    one_line(cli(tmp_path, "sweep", "x.yaml", "--dryrun"), "unrecognized arguments: --dryrun")


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    shutil.rmtree(READ_ONLY, ignore_errors=True)  # never created; kept tidy should a platform allow it
