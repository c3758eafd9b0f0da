"""Trial YAML is validated at the edge: errors name the file, the line and the problem."""

from pathlib import Path

import pytest
import yaml

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
        ("interpolation: tuned ", "interpolation: 1.5 ",
         r"reranking.interpolation: must be 'none', 'tuned' or a weight in \[0, 1\], got 1.5"),
        ("interpolation: tuned ", "interpolation: best ", r"reranking.interpolation: must be .* got 'best'"),
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


@pytest.mark.parametrize(
    "loss, augmentation, message",
    [
        ({"lambda": 0.3}, None, r"'lambda' has no effect with contrastive 'none'"),
        ({"contrastive": "scl", "contrastive_margin": 0.9}, None, r"'contrastive_margin' has no effect with contrastive 'scl'"),
        ({"contrastive": "ctriplet", "tau": 0.2}, None, r"'tau' has no effect with contrastive 'ctriplet'"),
        ({"weighting": "dwa"}, None, r"weighting 'dwa' combines two losses"),
        ({"contrastive": "infonce"}, None, r"infonce' contrasts a relevant pair with its augmented view"),
        ({"contrastive": "simclr"}, None, r"loss.contrastive: 'simclr' is not allowed"),
        (None, {"method": "glove"}, r"method 'glove' needs glove_path"),
        (None, {"method": "bm25", "glove_path": "x.txt"}, r"glove_path has no effect with method 'bm25'"),
    ],
)
def test_invalid_loss_and_augmentation_combinations(tmp_path, loss, augmentation, message):
    data = {"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}
    if loss:
        data["loss"] = loss
    if augmentation:
        data["augmentation"] = augmentation
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=message):
        load_spec(path, TrialSpec)


def test_valid_contrastive_spec_round_trips():
    spec = TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"},
                                     "loss": {"contrastive": "scl", "lambda": 0.3, "tau": 0.2},
                                     "augmentation": {"method": "bm25", "k": 2}})
    assert TrialSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert spec.flat_params()["loss.lambda"] == "0.3" and spec.axes()["augmentation"] == "bm25-k2"


def test_multi_trial_file_merges_base_and_points_at_override_lines(tmp_path):
    from orchestrator.config import load_trials

    experiment, specs = load_trials(REPO / "search_spaces" / "rq1-scifact.yaml", TrialSpec)
    assert experiment == "rq1-scifact"
    assert [s.name for s in specs] == ["rq1-scifact.baseline", "rq1-scifact.bm25-aug", "rq1-scifact.bm25-aug-scl"]
    assert specs[0].augmentation.method == "none" and specs[2].loss.contrastive == "scl"
    assert all(s.training_data.size == 1000 and s.model.name == "minilm-l6" for s in specs)
    path = tmp_path / "multi.yaml"
    path.write_text("name: m\nbase:\n  data: {collection: c}\n  model: {name: x}\ntrials:\n  a: {}\n  b:\n    loss: {ranking: nope}\n")
    with pytest.raises(InputError, match=r"multi.yaml:8: loss.ranking: 'nope' is not allowed"):
        load_trials(path, TrialSpec)


def test_trial_identity_is_unchanged_by_the_reranking_section_at_its_defaults():
    from orchestrator.run_trial import trial_key

    spec = TrialSpec.model_validate({"name": "x", "data": {"collection": "beir/scifact"},
                                     "model": {"name": "minilm-l6", "max_length": 128}})
    # The key this spec had before `reranking` existed: finished trials tracked then are reused.
    assert trial_key(spec) == "761b677795444a3d"
    tuned = spec.model_copy(update={"reranking": spec.reranking.model_copy(update={"interpolation": "tuned"})})
    assert trial_key(tuned) != trial_key(spec)
    assert load_spec(TRIAL, TrialSpec).reranking.interpolation == "tuned"
