"""Trial YAML is validated at the edge: errors name the file, the line and the problem."""

import shutil
from pathlib import Path

import pytest

from orchestrator.config import load_spec
from workloads.errors import InputError
from workloads.spec import TrialSpec

REPO = Path(__file__).resolve().parents[1]
TRIAL = REPO / "search_spaces" / "trial-scifact.yaml"


def test_shipped_trial_config_loads():
    spec = load_spec(TRIAL, TrialSpec)
    assert spec.model.name == "minilm-l6" and spec.training_data.size == 1000 and spec.loss.ranking == "pointwise"


def edited(tmp_path, old, new):
    """Write the shipped config with one edit; return it and the line of the edit's last line."""
    text = TRIAL.read_text()
    assert old in text
    changed = text.replace(old, new, 1)
    path = tmp_path / "trial.yaml"
    path.write_text(changed)
    line = changed[: changed.index(new) + len(new)].count("\n") + 1
    return path, line


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("ranking: pointwise", "ranking: listnet", r"loss.ranking: 'listnet' is not allowed"),
        ("  epochs: 2", "  epochs: 2\n  epocs: 3", r"optimization.epocs: unknown key"),
        ("size: 1000 ", "size: 999 ", r"size must be an even number"),
        ("  batch_size: 16", "  batch_size: 15", r"batch_size counts pairs"),
    ],
)
def test_invalid_values_name_file_and_line(tmp_path, old, new, message):
    path, line = edited(tmp_path, old, new)
    with pytest.raises(InputError, match=message) as info:
        load_spec(path, TrialSpec)
    assert str(info.value).startswith(f"{path}:{line}:")


def test_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nmodel: [unclosed\n")
    with pytest.raises(InputError, match=r"bad.yaml:\d+: malformed YAML"):
        load_spec(path, TrialSpec)


def test_missing_required_section(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("name: x\ndata: {collection: beir/scifact}\n")
    with pytest.raises(InputError, match=r"t.yaml:1: model: Field required"):
        load_spec(path, TrialSpec)


def test_missing_file():
    with pytest.raises(InputError, match="nope.yaml: cannot read"):
        load_spec(Path("nope.yaml"), TrialSpec)
