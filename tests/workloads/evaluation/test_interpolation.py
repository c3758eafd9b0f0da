"""Interpolating the cross-encoder with the first stage: hand values, the tuned weight, edges."""

import pytest

from workloads.evaluation import evaluate
from workloads.evaluation.reranking import WEIGHT_GRID, interpolate, merge_with_first_stage, tune_weight
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import final_interpolation
from workloads.training.epoch_metrics import WEIGHT_METRIC

FIRST_STAGE = {"q": {"d1": 10.0, "d2": 8.0, "d3": 6.0, "d4": 1.0}}  # d4 lies below the re-ranking depth
CROSS_ENCODER = {"q": {"d1": -1.0, "d2": 3.0, "d3": 1.0}}


@pytest.mark.parametrize(
    "weight, expected",
    [
        # min-max per query over the re-ranked documents: BM25 d1 1, d2 0.5, d3 0; CE d1 0, d2 1, d3 0.5
        (0.25, {"d1": 0.75, "d2": 0.625, "d3": 0.125}),
        (0.75, {"d1": 0.25, "d2": 0.875, "d3": 0.375}),
        (0.0, {"d1": 1.0, "d2": 0.5, "d3": 0.0}),
        (1.0, {"d1": 0.0, "d2": 1.0, "d3": 0.5}),
    ],
)
def test_interpolation_against_hand_values(weight, expected):
    fused = interpolate(CROSS_ENCODER, FIRST_STAGE, weight)["q"]
    assert fused == pytest.approx(expected)


def test_fused_run_keeps_the_documents_below_the_depth_in_first_stage_order():
    merged = merge_with_first_stage(interpolate(CROSS_ENCODER, FIRST_STAGE, 0.75), FIRST_STAGE)["q"]
    assert sorted(merged, key=merged.get, reverse=True) == ["d2", "d3", "d1", "d4"]


def test_a_ranker_with_tied_scores_expresses_no_preference():
    fused = interpolate({"q": {"a": 2.0, "b": 2.0}}, {"q": {"a": 5.0, "b": 1.0}}, 0.9)["q"]
    assert fused == pytest.approx({"a": 0.1, "b": 0.0})


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_weight_outside_unit_interval_is_rejected(weight):
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        interpolate(CROSS_ENCODER, FIRST_STAGE, weight)


def test_a_reranked_document_missing_from_the_first_stage_is_an_error():
    with pytest.raises(ValueError, match="query q: re-ranked document d9"):
        interpolate({"q": {"d1": 1.0, "d9": 0.0}}, FIRST_STAGE, 0.5)


def test_tuned_weight_is_the_largest_grid_weight_that_gets_both_queries_right():
    # q1: BM25 is right (a), the cross-encoder is wrong (c); fused, a stays on top while w < 0.5.
    # q2: the cross-encoder is right (y), BM25 narrowly wrong (x); fused, y wins once w > 1/11.
    # So nDCG@10 is best for w in (0.0909, 0.5): the grid's 0.10 ... 0.45, and ties keep the largest.
    first_stage = {"q1": {"a": 10.0, "b": 9.0, "c": 0.0}, "q2": {"x": 10.0, "y": 9.0, "z": 0.0}}
    cross_encoder = {"q1": {"a": 0.0, "b": 0.1, "c": 1.0}, "q2": {"x": 0.0, "y": 1.0, "z": 0.5}}
    qrels = {"q1": {"a": 1}, "q2": {"y": 1}}
    weight = tune_weight(cross_encoder, first_stage, qrels, 1)
    assert weight == 0.45 and weight in WEIGHT_GRID

    def ndcg(w):
        return evaluate(merge_with_first_stage(interpolate(cross_encoder, first_stage, w), first_stage), qrels).aggregate["ndcg_at_10"]

    assert ndcg(weight) == pytest.approx(1.0)
    assert ndcg(0.0) < 1.0 and ndcg(1.0) < 1.0 and ndcg(0.5) < 1.0  # either ranker alone, or past the crossover


def test_tuning_prefers_the_plain_reranker_when_fusion_does_not_help():
    first_stage = {"q": {"a": 3.0, "b": 2.0, "c": 1.0}}
    cross_encoder = {"q": {"a": 0.9, "b": 0.5, "c": 0.1}}  # same order as BM25: every weight ties
    assert tune_weight(cross_encoder, first_stage, {"q": {"a": 1}}, 1) == 1.0


@pytest.mark.parametrize("setting, expected", [("none", "none"), (0.3, 0.3), ("tuned", 0.65)])
def test_the_test_ranking_takes_the_validation_weight_of_the_chosen_epoch(setting, expected):
    spec = TrialSpec.model_validate({"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "m"},
                                     "reranking": {"interpolation": setting}})
    assert final_interpolation(spec, 0.65) == expected


def test_a_tuned_trial_without_a_recorded_weight_is_a_clear_error():
    spec = TrialSpec.model_validate({"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "m"},
                                     "reranking": {"interpolation": "tuned"}})
    with pytest.raises(ValueError, match=f"x: interpolation is 'tuned' but the chosen epoch recorded no {WEIGHT_METRIC}"):
        final_interpolation(spec, None)
