"""Trial YAML is validated at the edge: errors name the file, the line and the problem."""

from pathlib import Path

import pytest
import yaml

from orchestrator.core.config import load_spec, load_trials
from orchestrator.core.schema import flat_params
from orchestrator.lifecycle.identity import trial_key
from workloads.core.errors import InputError
from workloads.kinds import kind_of
from workloads.kinds.rerank.identity import _ALWAYS_KEYED_LOSS_PARAMETERS
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.selector.spec import selector_key, selector_trial

REPO = Path(__file__).resolve().parents[2]
TRIAL = REPO / "search_spaces" / "trials" / "trial-scifact.yaml"


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
        ({"lambda": 0.3}, None, r"'lambda' has no effect with ranking 'pointwise', contrastive 'none'"),
        ({"margin": 2.0}, None, r"'margin' has no effect with ranking 'pointwise'"),
        ({"contrastive": "scl", "contrastive_margin": 0.9}, None, r"'contrastive_margin' has no effect with .* contrastive 'scl'"),
        ({"contrastive": "ctriplet", "tau": 0.2}, None, r"'tau' has no effect with .* contrastive 'ctriplet'"),
        ({"contrastive": "scl", "nca_scale": 2.0}, None, r"'nca_scale' has no effect with .* contrastive 'scl'"),
        ({"contrastive": "tml", "scl_normalization": "global"}, None, r"'scl_normalization' has no effect"),
        ({"contrastive": "ctriplet", "ctriplet_centroid": "mean"}, None, r"loss.ctriplet_centroid: 'mean' is not allowed"),
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

    # searched values are params; the axes name the system (the same tags on cell and trial runs)
    assert flat_params(spec)["loss.lambda"] == "0.3" and kind_of(spec).axes(spec)["augmentation"] == "bm25"


def test_multi_trial_file_merges_base_and_points_at_override_lines(tmp_path):
    experiment, specs = load_trials(REPO / "search_spaces" / "trials" / "rq1-scifact.yaml", TrialSpec)
    assert experiment == "rq1-scifact"
    assert [s.name for s in specs] == ["rq1-scifact.baseline", "rq1-scifact.bm25-aug", "rq1-scifact.bm25-aug-scl"]
    assert specs[0].augmentation.method == "none" and specs[2].loss.contrastive == "scl"
    assert all(s.training_data.size == 1000 and s.model.name == "minilm-l6" for s in specs)
    path = tmp_path / "multi.yaml"
    path.write_text("name: m\nbase:\n  data: {collection: c}\n  model: {name: x}\ntrials:\n  a: {}\n  b:\n    loss: {ranking: nope}\n")
    with pytest.raises(InputError, match=r"multi.yaml:8: loss.ranking: 'nope' is not allowed"):
        load_trials(path, TrialSpec)


def test_trial_identity_is_unchanged_by_the_reranking_section_at_its_defaults():
    spec = TrialSpec.model_validate({"name": "x", "data": {"collection": "beir/scifact"},
                                     "model": {"name": "minilm-l6", "max_length": 128}})
    # The key this spec had before `reranking` existed: finished trials tracked then are reused.
    assert trial_key(spec) == "761b677795444a3d"
    tuned = spec.model_copy(update={"reranking": spec.reranking.model_copy(update={"interpolation": "tuned"})})
    assert trial_key(tuned) != trial_key(spec)
    assert load_spec(TRIAL, TrialSpec).reranking.interpolation == "tuned"
    # so is it by optimization.compile off (the key above); compiled steps round differently: a trial of its own
    compiled = spec.model_copy(update={"optimization": spec.optimization.model_copy(update={"compile": True})})
    assert trial_key(compiled) != trial_key(spec)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"validation_split": "test"}, r"data: validation_split and test_split are both 'test' on one collection"),
        ({"train_split": "test"}, r"data: train_split and test_split are both 'test' on one collection"),
        ({"validation_split": "train"}, r"data: validation_split and train_split are both 'train'"),
        ({"test_collection": "beir/scifact", "validation_split": "test"}, r"data: validation_split and test_split are both 'test'"),
    ],
)
def test_a_split_used_twice_is_refused_with_its_line(tmp_path, data, message):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "data": {"collection": "beir/scifact", **data}, "model": {"name": "minilm-l6"}},
                                   sort_keys=False))
    with pytest.raises(InputError, match=r"t.yaml:2: " + message):
        load_spec(path, TrialSpec)
    # a zero-shot test collection may use any split name
    other = {"name": "t", "data": {"collection": "beir/scifact", "train_split": "test", "test_collection": "elsewhere"},
             "model": {"name": "minilm-l6"}}
    assert TrialSpec.model_validate(other).data.test_collection == "elsewhere"


def test_trial_keys_of_losses_tracked_before_the_new_readings_are_unchanged():
    """Golden keys computed with the code before the loss readings (SCL normalisation, CTriplet
    centroid, TML reduction, NCA scale) and augmentation redraws existed: their runs are reused."""
    base = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}
    golden = [({"contrastive": "scl", "tau": 0.2}, "8f6ceb08fb249c20"), ({"contrastive": "tml"}, "9954609d6baef26f"),
              ({"ranking": "pairwise", "margin": 2.0}, "9a1825841da2cff2")]
    for loss, key in golden:
        assert trial_key(TrialSpec.model_validate({**base, "loss": loss})) == key
    # a reading that changes what is computed is a new trial
    for loss in ({"contrastive": "scl", "tau": 0.2, "scl_normalization": "global"}, {"contrastive": "tml", "tml_reduction": "nonzero"}):
        assert trial_key(TrialSpec.model_validate({**base, "loss": loss})) not in {k for _, k in golden}
    def ctriplet(centroid):
        return trial_key(TrialSpec.model_validate({**base, "loss": {"contrastive": "ctriplet", "ctriplet_centroid": centroid}}))

    assert ctriplet("inclusive") != ctriplet("leave_one_out")
    # one epoch: one draw whatever `redraw` says, so the same trial
    augmented = {**base, "augmentation": {"method": "bm25"}}
    assert trial_key(TrialSpec.model_validate(augmented)) == trial_key(
        TrialSpec.model_validate({**augmented, "augmentation": {"method": "bm25", "redraw": "once"}}))
    two_epochs = {**augmented, "optimization": {"epochs": 2}}
    assert trial_key(TrialSpec.model_validate(two_epochs)) != trial_key(
        TrialSpec.model_validate({**two_epochs, "augmentation": {"method": "bm25", "redraw": "once"}}))


def test_first_stage_index_at_build_keeps_every_key():
    """Keys computed before first_stage.index existed (by the code of 6cb764b): a trial's, a trial
    whose test collection has its own first stage, a selector's (a trained selector is found again)."""
    base = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}
    assert trial_key(TrialSpec.model_validate(base)) == "761b677795444a3d"
    zero_shot = {**base, "data": {"collection": "beir/scifact", "test_collection": "wikiqa", "test_split": "test",
                                  "test_first_stage": {"method": "given", "test_depth": 30}}}
    assert trial_key(TrialSpec.model_validate(zero_shot)) == "8b5baf93f11efbd1"
    linear = TrialSpec.model_validate({**base, "augmentation": {"method": "linear", "k": 2}})
    assert trial_key(linear) == "5113b924ee6420dd" and selector_key(selector_trial(linear)) == "efbb3c9d05e65d1b"
    prebuilt = TrialSpec.model_validate({**base, "first_stage": {"index": "prebuilt"}})
    assert trial_key(prebuilt) != trial_key(TrialSpec.model_validate(base))  # another index: another trial
    assert selector_key(selector_trial(linear.model_copy(update={"first_stage": prebuilt.first_stage}))) != "efbb3c9d05e65d1b"


def test_trial_keys_follow_the_loss_declarations():
    """Keys computed before loss parameters were declared once (issue 33): unchanged. A loss
    parameter outside the frozen first set is keyed only where read and off its keyed default,
    so a new loss or parameter (lambdaloss) needs no edit to keep every other key."""
    base = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}

    def key(loss, **more):
        return trial_key(TrialSpec.model_validate({**base, "loss": loss, **more}))

    golden = [({"contrastive": "nca"}, "4d65cca5c91defd8"), ({"contrastive": "nca", "nca_map": "identity"}, "5013d1c1fc9a0428"),
              ({"contrastive": "ctriplet", "ctriplet_centroid": "inclusive"}, "54dd7a26610ae366"),
              ({"contrastive": "ctriplet"}, "19afb6614edf022d"),
              ({"ranking": "mhl", "contrastive": "tml", "weighting": "dwa", "dwa_period": 200}, "de2648bde5ffc729"),
              ({"ranking": "listwise", "contrastive": "scl", "weighting": "equal"}, "4e8fb965d9a14731")]
    for loss, expected in golden:
        assert key(loss) == expected, loss
    assert key({"ranking": "pairwise", "contrastive": "infonce", "lambda": 0.25}, augmentation={"method": "bm25"}) == "dccd5c1cef56cc8b"
    # the set never grows: later parameters are left out by rule
    assert _ALWAYS_KEYED_LOSS_PARAMETERS == {"margin", "lambda_", "tau", "contrastive_margin", "nca_map", "dwa_period"}
    lambdaloss = key({"ranking": "lambdaloss"})
    assert lambdaloss == "b81a4fe712dc799a"
    assert lambdaloss not in {key({}), key({"ranking": "listwise"})} | {k for _, k in golden}
    assert key({"ranking": "lambdaloss", "lambdaloss_sigma": 1.0, "lambdaloss_mu": 10.0}) == lambdaloss  # its defaults
    assert len({lambdaloss, key({"ranking": "lambdaloss", "lambdaloss_sigma": 1.5}),
                key({"ranking": "lambdaloss", "lambdaloss_mu": 5.0})}) == 3
