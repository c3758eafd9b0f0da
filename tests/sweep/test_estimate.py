"""The dry run's compute estimate: pairs by hand, device-hours through a throughput profile,
and bad profiles as one line."""

import pytest
import yaml

from orchestrator.sweep.estimate import (
    THROUGHPUTS,
    _flops_per_token,
    choose_profile,
    estimate,
    judged_queries,
    load_throughputs,
    model_shape,
)
from orchestrator.sweep.grid import SweepSpec
from workloads.core.errors import InputError


def _sweep(model: str, augmentation: str = "none", zero_shot=(), seeds=(13,)) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "estimated",
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 "optimization": {"epochs": 2, "batch_size": 8}, "resources": {"workers": 1, "cpus_per_worker": 1}},
        "grid": {"models": [model], "max_length": 64, "losses": [{"ranking": "pointwise"}],
                 "augmentations": [{"method": augmentation, "k": 2}], "sizes": [16], "seeds": list(seeds)},
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


def test_each_seed_is_counted_trials_and_hours(tiny_model_dir, scifact_dir):
    """Seeds are cells: three seeds cost three times one (the claim grids ship three)."""
    a10g = load_throughputs(None)["a10g"]
    one = estimate(_sweep(str(tiny_model_dir)), a10g)
    three = estimate(_sweep(str(tiny_model_dir), seeds=(13, 14, 15)), a10g)
    assert (one["trials"], three["trials"]) == (3, 9)
    assert three["device_hours"] == pytest.approx(3 * one["device_hours"]) and one["device_hours"] > 0
    assert sorted(c["axes"]["seed"] for c in three["cells"]) == ["13", "14", "15"]


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
    # the dense layers' and attention's two matrix products over the cells' 64 tokens
    ratio = (12 * (4 * 768**2 + 2 * 768 * 3072 + 2 * 64 * 768)) / (layers * (4 * hidden**2 + 2 * hidden * inner + 2 * 64 * hidden))
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


def test_attention_matrix_products_are_counted_and_the_h100_profile_is_the_measured_one(tmp_path, scifact_dir):
    """BERT-base at 512 tokens against a BERT-base profile measured at 256: by hand, per token
    12 x (4·768² + 2·768·3072 + 2·T·768) multiply-adds, 94,371,840 at 512 and 89,653,248 at 256
    (attention's share at 512: 786,432 / 7,077,888 = +11.1%)."""
    assert _flops_per_token((12, 768, 3072), 512) == 94_371_840 and _flops_per_token((12, 768, 3072), 256) == 89_653_248
    assert _flops_per_token((12, 768, 3072), 512) / (12 * (4 * 768**2 + 2 * 768 * 3072)) == pytest.approx(1.1111, abs=1e-4)
    profile_file = tmp_path / "profile.yaml"
    profile_file.write_text(yaml.safe_dump({"at256": {"model": "bert-base-uncased", "tokens": 256,
                                                      "train_pairs_per_second": 4.0, "score_pairs_per_second": 10.0}}))
    sweep = _sweep("bert-base-uncased")
    sweep = sweep.model_copy(update={"grid": sweep.grid.model_copy(update={"max_length": 512})})
    (cell,) = estimate(sweep, choose_profile(sweep, "at256", profile_file))["cells"]
    scale = 94_371_840 * 512 / (89_653_248 * 256)  # 2.1053: without attention's products it would be exactly 2
    assert cell["train_hours"] == pytest.approx(3 * 32 * scale / 4.0 / 3600)
    h100, a10g = THROUGHPUTS["h100"], THROUGHPUTS["a10g"]
    assert (h100.train_pairs_per_second, h100.score_pairs_per_second, h100.measured) == (285.0, 1332.0, True)
    assert "617b804" in h100.source and h100.status == "measured"
    assert a10g.status == "assumed" and a10g.range[0] < 1 < a10g.range[1]


def test_the_range_and_the_other_profiles_by_hand(tmp_path, tiny_model_dir, scifact_dir):
    """A profile's range [0.5, 2] (factors on its rates) makes the hours [h / 2, h / 0.5] and the
    cost with them; a compared profile with twice the rates takes half the hours, one with the
    same rates at half the reference FLOPs... twice as many."""
    profile_file = tmp_path / "profile.yaml"
    profile_file.write_text(yaml.safe_dump({
        "mine": {"model": str(tiny_model_dir), "tokens": 64, "train_pairs_per_second": 4.0, "score_pairs_per_second": 10.0,
                 "measured": True, "range": [0.5, 2.0], "source": "a bench"},
        "twice": {"model": str(tiny_model_dir), "tokens": 64, "train_pairs_per_second": 8.0, "score_pairs_per_second": 20.0},
        "cpu": {"model": str(tiny_model_dir), "tokens": 64, "train_pairs_per_second": 8.0, "score_pairs_per_second": 20.0,
                "cpus": 1}}))
    sweep = _sweep(str(tiny_model_dir))
    profiles = load_throughputs(profile_file)
    result = estimate(sweep, choose_profile(sweep, "mine", profile_file), price_per_hour=2.0, compared=profiles)
    hours = (3 * 32 / 4.0 + (3 * 50 + 900) / 10.0) / 3600  # test_one_cell_by_hand's cell
    assert result["device_hours"] == pytest.approx(hours)
    assert result["device_hours_range"] == pytest.approx([hours / 2, hours / 0.5])
    assert result["cost_range"] == pytest.approx([hours, 4 * hours])
    assert result["profile"]["status"] == "measured" and tuple(result["profile"]["range"]) == (0.5, 2.0)
    compared = {p["name"]: p for p in result["profiles"]}
    assert "cpu" not in compared and "cpu-2core" not in compared  # a CPU rate scales with each worker's CPUs
    assert compared["twice"]["device_hours"] == pytest.approx(hours / 2)
    assert compared["twice"]["status"] == "assumed" and compared["twice"]["device_hours_range"] == pytest.approx([hours / 2] * 2)
    assert compared["mine"]["device_hours"] == pytest.approx(hours)
    # the built-in h100 (BERT-base at 512) by its own FLOPs: the tiny model's work at its 64 tokens
    (layers, hidden, inner), _ = model_shape(str(tiny_model_dir))
    tiny = layers * (4 * hidden**2 + 2 * hidden * inner + 2 * 64 * hidden) * 64
    bert = 94_371_840 * 512
    expected = (3 * 32 / 285.0 + (3 * 50 + 900) / 1332.0) * tiny / bert / 3600
    assert compared["h100"]["device_hours"] == pytest.approx(expected)
    assert compared["h100"]["device_hours_range"] == pytest.approx([expected / 1.15, expected / 0.9])


def test_a_profiles_range_must_hold_its_rates(tmp_path, tiny_model_dir):
    sweep = _sweep(str(tiny_model_dir))
    broken = tmp_path / "range.yaml"
    broken.write_text(yaml.safe_dump({"mine": {"model": str(tiny_model_dir), "tokens": 64, "train_pairs_per_second": 4.0,
                                               "score_pairs_per_second": 10.0, "range": [1.2, 2.0]}}))
    with pytest.raises(InputError, match=r"profile 'mine': range: .*0 < low <= 1 <= high") as refused:
        choose_profile(sweep, "mine", broken)
    assert "\n" not in str(refused.value)


# ----------------------------------------------------------------------------- EAR, robustness and SIR by hand


def _profile_at(tmp_path, model: str, tokens: int):
    """A profile of the cells' own model at their own length: hours are pairs / rate, unscaled."""
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump({"own": {"model": model, "tokens": tokens, "train_pairs_per_second": 4.0,
                                            "score_pairs_per_second": 10.0}}))
    return load_throughputs(path)["own"]


def test_an_ear_cell_counts_the_winners_keep_step_by_hand(tmp_path, scifact_dir):
    """SciFact: 809 judged training queries, 50 carved for validation, 300 test; the largest
    searched n (10) expansions each, 2 epochs, 2 trials. Training 759 x 10 x 2, validation
    50 x 10 x 2 per trial; the winner's test (300 x 10) and its keep step: every query's
    expansions scored once more, (759 + 50 + 300) x 10, so (759 + 50 + 2 x 300) x 10 = 14,090."""
    assert (judged_queries("beir/scifact", "train"), judged_queries("beir/scifact", "test")) == (809, 300)
    sweep = SweepSpec.model_validate({
        "name": "e", "base": {"kind": "ear", "data": {"collection": "beir/scifact", "validation_queries": 50},
                              "ear": {"epochs": 2}},
        "grid": {"models": ["bert-base-uncased"], "rerankers": ["ri"], "seeds": [1], "max_length": 256},
        "search": {"trials_per_cell": 2, "n": {"choices": [5, 10]}}})
    result = estimate(sweep, _profile_at(tmp_path, "bert-base-uncased", 256))
    (cell,) = result["cells"]
    assert (cell["trials"], cell["train_pairs"], cell["validation_pairs"], cell["test_pairs"]) == (2, 15_180, 1_000, 14_090)
    assert cell["train_hours"] == pytest.approx(2 * 15_180 / 4.0 / 3600)
    assert cell["evaluation_hours"] == pytest.approx((2 * 1_000 + 14_090) / 10.0 / 3600)
    assert result["device_hours"] == pytest.approx(cell["train_hours"] + cell["evaluation_hours"])


def _sir_sweep(model: str, robustness=(), zero_shot=()) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "s",
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 "training_data": {"negatives": 7}, "optimization": {"epochs": 2, "batching": "per_query", "batch_size": 16},
                 "resources": {"workers": 1, "cpus_per_worker": 1}, "robustness": list(robustness)},
        "grid": {"models": [model], "max_length": 64, "sizes": [16], "augmentations": [{"method": "none"}],
                 "baseline_ranking": "sir",
                 "losses": [{"ranking": "sir", "sir": {"variant": "v1", "levels": [4, 2]}},
                            {"ranking": "sir", "sir": {"variant": "v4", "levels": [4, 2]}}]},
        "search": {"trials_per_cell": 3}, "zero_shot": list(zero_shot)})


def test_staged_sir_trains_and_validates_every_stages_epochs(tmp_path, tiny_model_dir, scifact_dir):
    """v1 with levels [4, 2] trains 3 compressors (level 1 and each compressed level) for 2
    epochs each: 6 epochs of 16 rows and of 5 x 5 validation pairs; V0 (the baseline cell)
    and v4 (one network) train 2."""
    result = estimate(_sir_sweep(str(tiny_model_dir)), _profile_at(tmp_path, str(tiny_model_dir), 64))
    cells = {c["axes"]["loss"]: c for c in result["cells"]}
    assert {loss: (c["train_pairs"], c["validation_pairs"]) for loss, c in cells.items()} == {
        "sir": (16 * 2, 5 * 5 * 2), "sir@v1[4-2]": (16 * 6, 5 * 5 * 6), "sir@v4[4-2]": (16 * 2, 5 * 5 * 2)}
    assert cells["sir@v1[4-2]"]["train_hours"] == pytest.approx(3 * 96 / 4.0 / 3600)
    assert cells["sir@v1[4-2]"]["evaluation_hours"] == pytest.approx((3 * 150 + 300 * 3) / 10.0 / 3600)


def test_robustness_targets_perturb_the_own_test_queries_not_the_zero_shot_ones(tmp_path, tiny_model_dir, scifact_dir):
    """Two perturbations of SciFact's 300 test queries are two more targets of 300 x 3 pairs (at
    most: a query without a variant is left out); NFCorpus's 323 zero-shot queries are tested
    once: 300 x 3 x 3 + 323 x 3 = 3,669."""
    profile = _profile_at(tmp_path, str(tiny_model_dir), 64)
    plain = estimate(_sir_sweep(str(tiny_model_dir)), profile)["cells"][0]
    perturbed = estimate(_sir_sweep(str(tiny_model_dir), ["typo", "punctuation"]), profile)["cells"][0]
    both = estimate(_sir_sweep(str(tiny_model_dir), ["typo", "punctuation"], [{"collection": "beir/nfcorpus"}]),
                    profile)["cells"][0]
    assert (plain["test_pairs"], perturbed["test_pairs"], both["test_pairs"]) == (900, 2_700, 3_669)
    assert both["evaluation_hours"] - plain["evaluation_hours"] == pytest.approx((3_669 - 900) / 10.0 / 3600)
