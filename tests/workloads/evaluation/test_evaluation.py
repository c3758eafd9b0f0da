"""Our metrics equal pytrec_eval's (trec_eval) on the same runs, graded and binary."""

import itertools

import pytest
import pytrec_eval

from workloads.data.resolve import resolve_collection
from workloads.evaluation import evaluate, mean_of
from workloads.evaluation.reranking import merge_with_first_stage
from workloads.retrieval.bm25 import retrieve

# trec_eval measure for each of ours (binary measures take trec_eval's relevance_level).
TREC_EVAL = {"ndcg_at_10": "ndcg_cut_10", "ndcg_at_20": "ndcg_cut_20", "ap": "map", "p_at_1": "P_1"}


def trec_eval(run, qrels, level):
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "ndcg_cut_20", "map", "P_1", "recip_rank"},
                                               relevance_level=level)
    return evaluator.evaluate(run)


GRADED_QRELS = {
    "q1": {"d1": 3, "d2": 1, "d3": 0, "d4": 2},
    "q2": {"d5": 1, "d6": 2},
    "q3": {"d7": 1},  # judged, never retrieved -> counts as 0
}
RUN = {
    "q1": {"d3": 9.0, "d2": 8.0, "d1": 7.0, "x": 6.0, "d4": 5.0},
    "q2": {"y": 3.0, "d6": 2.0, "z": 1.5, "d5": 1.0},
    "q9": {"d1": 1.0},  # not judged -> ignored
}


@pytest.mark.parametrize("level", [1, 2])
def test_matches_trec_eval_on_graded_judgements(level):
    ours = evaluate(RUN, GRADED_QRELS, relevance_level=level)
    theirs = trec_eval(RUN, GRADED_QRELS, level)
    assert ours.num_queries == 3
    for name, measure in TREC_EVAL.items():
        for qid in ("q1", "q2"):
            assert ours.per_query[name][qid] == pytest.approx(theirs[qid][measure], abs=1e-9), (name, qid)
        assert ours.per_query[name]["q3"] == 0.0
        # trec_eval -c: every judged query counts, missing ones as 0
        expected = sum(theirs[q][measure] for q in ("q1", "q2")) / 3
        assert ours.aggregate[name] == pytest.approx(expected, abs=1e-9)
    for qid in ("q1", "q2"):
        assert ours.per_query["rr_at_100"][qid] == pytest.approx(theirs[qid]["recip_rank"], abs=1e-9)


def test_binary_level_changes_binary_measures():
    # q2 at level 2: only d6 (rank 2) counts -> P@1 = 0 ; q1 at level 2: d1 at rank 3 first
    assert evaluate(RUN, GRADED_QRELS, 2).per_query["rr_at_10"]["q1"] == pytest.approx(1 / 3)
    assert evaluate(RUN, GRADED_QRELS, 1).per_query["rr_at_10"]["q1"] == pytest.approx(1 / 2)


def test_matches_trec_eval_on_real_bm25_run(scifact_dir):
    collection = resolve_collection(str(scifact_dir))
    qrels = collection.split_qrels("test")
    run, _ = retrieve(collection, collection.split_queries("test"), k=100)
    ours = evaluate(run, qrels, 1)
    theirs = trec_eval(run, qrels, 1)
    for name, measure in TREC_EVAL.items():
        expected = sum(theirs[q][measure] for q in theirs) / len(qrels)
        assert ours.aggregate[name] == pytest.approx(expected, abs=1e-9), name


def test_merge_keeps_first_stage_order_below_reranked():
    first_stage = {"q": {"a": 10.0, "b": 9.0, "c": 8.0, "d": 7.0}}
    reranked = {"q": {"a": 0.1, "b": 0.9}}
    merged = merge_with_first_stage(reranked, first_stage)["q"]
    assert sorted(merged, key=merged.get, reverse=True) == ["b", "a", "c", "d"]


def test_a_mean_has_the_same_digits_on_every_python_and_in_every_order():
    """The built-in sum() of floats is naive on 3.11 (0.1 * 10 sums to 0.9999999999999999) and
    compensated from 3.12 (still order-dependent on these five); math.fsum is neither."""
    assert mean_of([0.1] * 10) == 0.1
    values = [0.7, -1e16, 0.2, 1e16, 0.2]  # exact sum 1.1
    assert {mean_of(p) for p in itertools.permutations(values)} == {1.1 / 5}
    # ten queries whose relevant document is 10th: RR@10 0.1 each, their mean 0.1 (evaluate's aggregate is mean_of)
    qrels = {f"q{i}": {"rel": 1} for i in range(10)}
    run = {q: {"rel": 1.0, **{f"n{j}": 2.0 + j for j in range(9)}} for q in qrels}
    assert evaluate(run, qrels, metrics=("rr_at_10",)).aggregate == {"rr_at_10": 0.1}
