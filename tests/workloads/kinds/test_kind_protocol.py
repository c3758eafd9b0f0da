"""The trial kinds' declarations and the first-stage registry are what the control plane asks:
a kind's searched parameters become the sweep's search space and land where they declare, a
registered first stage is validated and keyed from its entry, and no module outside the kinds'
packages names a kind."""

import ast
import re
from pathlib import Path

import pytest

from orchestrator.lifecycle.identity import trial_key
from orchestrator.sweep.grid import SearchSpec
from workloads.kinds import TRIAL_KINDS, kind_of
from workloads.kinds.ear.spec import EarTrialSpec
from workloads.kinds.rerank.spec import TrialSpec
from workloads.retrieval.first_stage import FIRST_STAGES, FirstStageMethod
from workloads.spec import FirstStageSpec

ROOT = Path(__file__).resolve().parents[3]
BASE = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}


def test_every_searched_parameter_is_in_the_search_space_and_lands_where_declared():
    examples = {"rerank": TrialSpec.model_validate({**BASE, "augmentation": {"method": "bm25"},
                                                    "loss": {"contrastive": "scl"}}),
                "ear": EarTrialSpec.model_validate({**BASE, "kind": "ear"})}
    for name, spec in examples.items():
        kind = TRIAL_KINDS[name]
        assert kind_of(spec) is kind and kind.searched
        for parameter in kind.searched:
            assert parameter.name in SearchSpec.model_fields, f"{name}: {parameter.name} cannot be searched"
            if parameter.name not in kind.searched_names(spec):
                continue
            data = spec.model_dump(mode="json")
            for part in parameter.path:
                data = data[part]
            changed = kind_of(spec).apply_params(spec, {parameter.name: data + 1 if isinstance(data, int) else data * 1.5})
            value = changed.model_dump(mode="json")
            for part in parameter.path:
                value = value[part]
            assert value != data, f"{name}: {parameter.name} did not reach {'.'.join(parameter.path)}"
    # EAR's searched alpha, max_rank and n are the EAR kind's declarations
    assert {p.name: p.path for p in TRIAL_KINDS["ear"].searched} == {
        "learning_rate": ("ear", "learning_rate"), "alpha": ("ear", "alpha"), "max_rank": ("ear", "max_rank"),
        "n": ("expansion", "n")}


def test_a_registered_first_stage_is_validated_and_keyed_from_its_entry(monkeypatch):
    bm25 = trial_key(TrialSpec.model_validate(BASE))
    with pytest.raises(ValueError, match="Input should be 'bm25', 'rm3'"):
        FirstStageSpec(method="toy")
    monkeypatch.setitem(FIRST_STAGES, "toy", FirstStageMethod("toy", lambda *args: None, "toy run",
                                                              fields={"path": "a toy file"}, needs={"path": "a toy file"}))
    with pytest.raises(ValueError, match=r"method 'toy' needs path \(a toy file\)"):
        FirstStageSpec(method="toy")
    with pytest.raises(ValueError, match="k1 and b belong to bm25, rm3"):
        FirstStageSpec(method="toy", path="p", k1=2.0)
    toy = TrialSpec.model_validate({**BASE, "first_stage": {"method": "toy", "path": "p"}})
    assert FirstStageSpec(method="toy", path="p").unread_fields() >= {"run", "index", "fb_terms"}
    assert trial_key(TrialSpec.model_validate(BASE)) == bm25 == "761b677795444a3d"  # a new entry changes no key
    assert trial_key(toy) != bm25


# Lines outside workloads/kinds/ that may name a kind: none is a branch on a kind.
_ALLOWED = {("workloads/evaluation/reranking.py", 'label: str = "rerank"')}  # a progress label (the verb)
# Modules outside workloads/kinds/ that may import a kind's package: commands and a table of one kind.
_ALLOWED_IMPORTS = {
    ("orchestrator/cli/expand.py", "ear"): "`orchestrate expand` is EAR's own command (the expansions of its trials)",
    ("orchestrator/cli/augment.py", "rerank"): "`orchestrate augment` is re-ranking's own command (its augmentation sets)",
    ("orchestrator/report/robustness.py", "rerank"): "the robustness table reads re-ranking trial files (TrialSpec: CFT)",
}


def _kind_packages() -> set[str]:
    """Every kind's package: each package under workloads/kinds/ (the registered kinds' among them)."""
    packages = {p.name for p in (ROOT / "workloads" / "kinds").iterdir() if (p / "__init__.py").exists()}
    registered = {k.spec.__module__.split(".")[2] for k in TRIAL_KINDS.values() if k.spec.__module__.startswith("workloads.kinds.")}
    assert registered and registered <= packages, registered - packages
    return packages


def _imported_kinds(source: str, packages: set[str]) -> list[tuple[int, str, str]]:
    """(line, imported module, kind package) of every import of a kind's package, function-local ones too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["workloads", "kinds"] and len(parts) > 2 and parts[2] in packages:
                found.append((node.lineno, module, parts[2]))
                break
    return found


def test_no_module_outside_the_kinds_names_a_kind():
    """Everything the control plane and the shared layers know of a kind they ask its
    declaration (``TrialKind``), never its name, and they import no kind's package: only the
    package's face, ``workloads.kinds`` (a kind's own command or table aside, each with its reason)."""
    names = re.compile(r'"(ear|selector|rerank)"|EarTrialSpec|SelectorTrialSpec')
    packages = _kind_packages()
    found = []
    for package in ("orchestrator", "workloads"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("workloads/kinds/"):
                continue
            source = path.read_text()
            for number, line in enumerate(source.splitlines(), 1):
                if names.search(line) and not any(relative == f and allowed in line for f, allowed in _ALLOWED):
                    found.append(f"{relative}:{number}: {line.strip()}")
            for number, module, kind in _imported_kinds(source, packages):
                if (relative, kind) not in _ALLOWED_IMPORTS:
                    found.append(f"{relative}:{number}: imports {module}")
    assert found == []


def test_the_import_check_finds_an_import_of_a_kind():
    """The check itself: a kind's module imported, at the top or in a function, by name or as a submodule."""
    packages = _kind_packages()
    assert {"rerank", "selector", "ear", "dense"} <= packages
    source = ("from workloads.kinds.selector.kind import KIND\nimport workloads.kinds.rerank.spec as spec\n"
              "from workloads.kinds import dense, kind_of\nfrom workloads.kinds import TRIAL_KINDS\n"
              "def f():\n    from workloads.kinds.ear import steps\n")
    assert [(n, kind) for n, _, kind in _imported_kinds(source, packages)] == [(1, "selector"), (2, "rerank"), (3, "dense"),
                                                                                (6, "ear")]
