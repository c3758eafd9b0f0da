"""The dry run's compute estimate: pairs by hand, device-hours through a throughput profile,
and bad profiles as one line."""

import pytest
import yaml

from orchestrator.sweep.estimate import choose_profile, estimate, load_throughputs, model_shape
from orchestrator.sweep.grid import SweepSpec
from workloads.errors import InputError


def _sweep(model: str, augmentation: str = "none", zero_shot=()) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "estimated",
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 "optimization": {"epochs": 2, "batch_size": 8}, "resources": {"workers": 1, "cpus_per_worker": 1}},
        "grid": {"models": [model], "max_length": 64, "losses": [{"ranking": "pointwise"}],
                 "augmentations": [{"method": augmentation, "k": 2}], "sizes": [16]},
        "search": {"trials_per_cell": 3}, "zero_shot": list(zero_shot)})


def test_one_cell_by_hand(tmp_path, tiny_model_dir, scifact_dir):
    profile_file = tmp_path / "profile.yaml"
    # the cell's own model at its own length: no scaling, the hours are pairs / rate
    profile_file.write_text(yaml.safe_dump({"mine": {"model": str(tiny_model_dir), "tokens": 64,
                                                     "train_pairs_per_second": 4.0, "score_pairs_per_second": 10.0}}))
    sweep = _sweep(str(tiny_model_dir))
    result = estimate(sweep, choose_profile(sweep, "mine", profile_file), price_per_hour=2.0)
    (cell,) = result["cells"]
    assert (cell["train_pairs"], cell["validation_pairs"], cell["test_pairs"]) == (16 * 2, 5 * 5 * 2, 300 * 3)
    assert cell["train_hours"] == pytest.approx(3 * 32 / 4.0 / 3600)
    assert cell["evaluation_hours"] == pytest.approx((3 * 50 + 900) / 10.0 / 3600)
    assert result["cost"] == pytest.approx(2.0 * result["device_hours"])
    done = estimate(sweep, choose_profile(sweep, "mine", profile_file), trials_left={cell["key"]: 0})
    assert done["device_hours"] == 0 and done["trials"] == 0  # nothing left to run, nothing left to test


def test_augmentation_doubles_the_training_pairs_and_zero_shot_targets_add_test_pairs(tiny_model_dir, scifact_dir):
    plain = estimate(_sweep(str(tiny_model_dir)), load_throughputs(None)["a10g"])["cells"][0]
    augmented = estimate(_sweep(str(tiny_model_dir), "bm25", [{"collection": "beir/nfcorpus"}]),
                         load_throughputs(None)["a10g"])["cells"]
    assert all(c["train_pairs"] == 2 * plain["train_pairs"] for c in augmented if c["axes"]["augmentation"] != "none")
    assert all(c["test_pairs"] == (300 + 323) * 3 for c in augmented)


def test_a_model_is_scaled_by_its_multiply_adds_per_token(tiny_model_dir, scifact_dir):
    a10g = load_throughputs(None)["a10g"]
    tiny = estimate(_sweep(str(tiny_model_dir)), a10g)["cells"][0]
    bert = estimate(_sweep("bert-base-uncased"), a10g)["cells"][0]
    (layers, hidden, inner), source = model_shape(str(tiny_model_dir))
    assert source == "its config"
    ratio = (12 * (4 * 768**2 + 2 * 768 * 3072)) / (layers * (4 * hidden**2 + 2 * hidden * inner))
    assert bert["train_hours"] / tiny["train_hours"] == pytest.approx(ratio)
    assert model_shape("someone/unknown-model")[1].startswith("assumed BERT-base")


def test_bad_profiles_are_one_line(tmp_path, tiny_model_dir):
    sweep = _sweep(str(tiny_model_dir))
    with pytest.raises(InputError, match="no such throughput profile"):
        choose_profile(sweep, "tpu", None)
    broken = tmp_path / "broken.yaml"
    broken.write_text("mine: {model: x, tokens: 64, speed: 3}\n")
    with pytest.raises(InputError, match="not a throughput file"):
        choose_profile(sweep, "mine", broken)


def test_data_parallel_workers_share_the_training_pairs_and_wait_while_rank_0_validates(tiny_model_dir, scifact_dir):
    a10g = load_throughputs(None)["a10g"]
    one = estimate(_sweep(str(tiny_model_dir)), a10g)["cells"][0]
    two_workers = _sweep(str(tiny_model_dir)).model_copy(deep=True)
    two_workers.base["resources"]["workers"] = 2
    two = estimate(two_workers, a10g)["cells"][0]
    assert two["train_hours"] == pytest.approx(one["train_hours"])  # the same pairs, split over two devices
    validation = lambda c: c["trials"] * c["validation_pairs"] / a10g.score_pairs_per_second / 3600  # noqa: E731
    scale = one["evaluation_hours"] / (validation(one) + one["test_pairs"] / a10g.score_pairs_per_second / 3600)
    assert two["evaluation_hours"] - one["evaluation_hours"] == pytest.approx(validation(one) * scale)


def test_unknown_sizes_are_said_not_counted_as_zero_silently(tiny_model_dir, scifact_dir):
    sweep = _sweep(str(tiny_model_dir)).model_copy(deep=True)
    sweep.grid.sizes[0] = "full"
    result = estimate(sweep, load_throughputs(None)["a10g"])
    assert result["cells"][0]["train_pairs"] is None and result["cells_with_unknown_sizes"] == [result["cells"][0]["key"]]
