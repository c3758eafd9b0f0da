"""Every measure we offer equals trec_eval's (pytrec_eval) on runs with tied scores, and the runs we
write and cut are ordered as trec_eval orders them (score descending, ties by doc id descending)."""

import random

import ir_measures
import pytest
import pytrec_eval

import workloads.evaluation as evaluation
from workloads.evaluation import MEASURES, PRIMARY_METRIC, Evaluator, evaluate
from workloads.evaluation.ranking import ranked_ids, strictly_ranked, top_of, trec_eval_order
from workloads.evaluation.reranking import WEIGHT_GRID, interpolate, merge_with_first_stage, tune_weight
from workloads.kinds.dense.hybrid import interpolate_runs, reciprocal_rank_fusion, tune_fusion_weight
from workloads.kinds.ear.retrieval import best_rank
from workloads.kinds.rerank.training_sets import ranked_ids as training_ranked
from workloads.retrieval.bm25 import write_trec_rankings
from workloads.retrieval.first_stage import top_k
from workloads.retrieval.mining import MiningOptions, negative_pool

TREC_EVAL_CUT_NAMES = {"P": "P", "R": "recall", "Success": "success"}


def trec_eval_name(measure) -> tuple[str, int | None]:
    """pytrec_eval's name for one of our ir_measures measures, and the cutoff trec_eval's measure
    lacks (RR@k: recip_rank has none). A measure with no entry here fails: add its reference."""
    name, cutoff = measure.NAME, measure.params.get("cutoff")
    if name == "nDCG" and cutoff:
        return f"ndcg_cut.{cutoff}", None
    if name == "AP":
        return (f"map_cut.{cutoff}", None) if cutoff else ("map", None)
    if name == "RR":
        return "recip_rank", cutoff
    if name in ("P", "R", "Success") and cutoff:
        return f"{TREC_EVAL_CUT_NAMES[name]}.{cutoff}", None
    raise AssertionError(f"no trec_eval reference for {measure}: add one to trec_eval_name")


def trec_eval_value(metric: str, run, qrels, level: int) -> dict[str, float]:
    """Per query (every judged query; 0 where the run has none) the value trec_eval gives."""
    measure = ir_measures.parse_measure(MEASURES[metric].format(rel=level))
    name, cutoff = trec_eval_name(measure)
    results = pytrec_eval.RelevanceEvaluator(qrels, {name}, relevance_level=level).evaluate(run)
    out = {}
    for qid in qrels:
        value = next(iter(results[qid].values())) if qid in results else 0.0
        if cutoff is not None and value < 1.0 / cutoff:  # RR@k: the first relevant below rank k counts 0
            value = 0.0
        out[qid] = value
    return out


ODD_IDS = ["d1", "d2", "d9", "d10", "d100", "D1", "a", "B", "doc-é", "doc-z", "_x", "0"]


def tied_runs(seed: int):
    """Runs whose scores tie in several patterns (all tied, ties at the top, few distinct scores,
    one tie group spanning each cutoff offered: 1, 5, 10, 20, 100, 1000) with graded qrels whose
    relevant documents sit inside the ties; ids that order differently as strings and numbers."""
    rng = random.Random(seed)
    run, qrels = {}, {}
    patterns = ["all_tied", "top_tied", "few_scores", "deep", "single", 5, 10, 20, 100, 1000]
    for i, pattern in enumerate(patterns * 3):
        qid = f"q{i}"
        cut = pattern if isinstance(pattern, int) else None
        size = {"deep": 150, "single": 1}.get(pattern, rng.randint(12, 40)) if cut is None else cut + 10
        ids = (ODD_IDS + [f"d{n}" for n in range(11, 11 + size)])[:size]
        rng.shuffle(ids)
        if pattern == "all_tied":
            scores = {d: 1.5 for d in ids}
        elif pattern == "top_tied":
            scores = {d: (9.0 if n < 6 else 5.0 - n / 100) for n, d in enumerate(ids)}
        elif cut is not None:  # one tie group over ranks cut-2 .. cut+3, the judged documents in it
            scores = {d: (2.0 * size - n if n < cut - 3 else size / 2 if n < cut + 3 else 1.0 / n) for n, d in enumerate(ids)}
            group = ids[cut - 3:cut + 3]
            qrels[qid] = {d: grade for d, grade in zip(rng.sample(group, 3), (rng.choice((1, 2, 3)), 0, 1))}
        else:
            scores = {d: float(rng.randint(0, 4)) for d in ids}
        run[qid] = scores
        if cut is None:
            qrels[qid] = {d: rng.choice((0, 1, 2, 3)) for d in rng.sample(ids, max(1, size // 4))}
    qrels["unretrieved"] = {"nowhere": 2}  # judged, not in the run: 0 for every measure
    return run, qrels


@pytest.mark.parametrize("metric", sorted(MEASURES))
@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_offered_measure_equals_trec_eval_on_tied_runs(metric, level, seed):
    run, qrels = tied_runs(seed)
    ours = evaluate(run, qrels, level, (metric,)).per_query[metric]
    theirs = trec_eval_value(metric, run, qrels, level)
    assert ours.keys() == theirs.keys()
    for qid in theirs:
        assert ours[qid] == pytest.approx(theirs[qid], abs=1e-12, rel=0), (metric, qid)


def test_the_issue_example_rr_is_trec_evals():
    run, qrels = {"q": {"d1": 3.0, "d2": 2.0, "d3": 2.0}}, {"q": {"d3": 1}}
    ours = evaluate(run, qrels, 1, ("rr_at_10", "ndcg_at_10", "ap")).aggregate
    theirs = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut.10", "map"}).evaluate(run)["q"]
    assert ours["rr_at_10"] == theirs["recip_rank"] == 0.5  # ir_measures alone gives 1/3
    assert ours["ndcg_at_10"] == pytest.approx(theirs["ndcg_cut_10"], abs=1e-15)
    assert ours["ap"] == theirs["map"] == 0.5


@pytest.mark.parametrize("ids", [("B", "a"), ("d10", "d9"), ("z", "é"), ("d1", "d1a")])
def test_the_order_is_trec_evals_own(ids):
    """Ties go to the larger id in byte order, as pytrec_eval ranks them: the first of two tied
    documents is the one whose relevance earns RR 1."""
    run = {d: 1.0 for d in ids}
    first = ranked_ids(run)[0]
    assert first == ids[1]
    rr = pytrec_eval.RelevanceEvaluator({"q": {first: 1}}, {"recip_rank"}).evaluate({"q": run})["q"]["recip_rank"]
    assert rr == 1.0


def test_trec_eval_order_cuts_and_scores():
    scores = {"d1": 2.0, "d3": 1.0, "d2": 1.0, "d10": 1.0, "d4": 0.5}
    assert trec_eval_order(scores) == [("d1", 2.0), ("d3", 1.0), ("d2", 1.0), ("d10", 1.0), ("d4", 0.5)]
    assert top_of(scores, 2) == {"d1": 2.0, "d3": 1.0}  # the tie at the cut: d3 stays, d2 and d10 go
    assert strictly_ranked({"q": scores}) == {"q": {"d1": 5.0, "d3": 4.0, "d2": 3.0, "d10": 2.0, "d4": 1.0}}


def test_one_evaluator_scores_many_runs_as_evaluate_does():
    run, qrels = tied_runs(3)
    runs = [{q: {d: s * (1 + w) + (len(d) % 3) * w for d, s in docs.items()} for q, docs in run.items()}
            for w in (0.0, 0.5, 2.0)]
    evaluator = Evaluator(qrels, 2)
    for each in runs:
        assert evaluator(each) == evaluate(each, qrels, 2)


# One query whose ties cross the cut at 2: trec_eval ranks b3 > b2 > b10 (byte order, descending).
TIED = {"a": 2.0, "b10": 1.0, "b2": 1.0, "b3": 1.0, "c": 0.5}
TREC_EVAL_RANKING = ["a", "b3", "b2", "b10", "c"]


def test_every_ranking_the_project_writes_or_cuts_is_in_trec_evals_order(tmp_path):
    path = tmp_path / "run.trec"
    write_trec_rankings([("q", TIED)], path, "t", k=3)
    assert [line.split()[2] for line in path.read_text().splitlines()] == TREC_EVAL_RANKING[:3]  # the cut keeps b3, b2
    assert list(top_k({"q": TIED}, {"q": "text"}, 2)["q"]) == TREC_EVAL_RANKING[:2]
    assert training_ranked(TIED) == TREC_EVAL_RANKING
    assert [d for d, _ in negative_pool(TIED, {}, {"a"}, MiningOptions(depth=2))] == ["b3", "b2"]
    assert best_rank(TIED, {"b2": 1, "b10": 1}, 1, 99) == 3
    merged = merge_with_first_stage({"q": {"x": 5.0}}, {"q": TIED})
    assert ranked_ids(merged["q"]) == ["x", *TREC_EVAL_RANKING]
    # RRF over one run keeps its order; the cut at 2 keeps trec_eval's top 2, not a, b10
    assert list(reciprocal_rank_fusion([{"q": TIED}], k=2)["q"]) == TREC_EVAL_RANKING[:2]
    assert list(interpolate_runs({"q": TIED}, {"q": TIED}, 0.5, k=2)["q"]) == TREC_EVAL_RANKING[:2]


def test_a_weight_search_builds_one_evaluator_and_finds_what_one_per_weight_finds(monkeypatch):

    rng = random.Random(5)
    dense = {f"q{q}": {f"d{d}": round(rng.random(), 1) for d in range(30)} for q in range(12)}
    lexical = {q: {d: float(rng.randint(0, 5)) for d in docs} for q, docs in dense.items()}
    qrels = {q: {f"d{d}": rng.choice((0, 1, 2)) for d in rng.sample(range(30), 6)} for q in dense}

    def searched(fuse):  # the search with an evaluator built per weight, as before
        values = {w: evaluate(fuse(w), qrels, 1, (PRIMARY_METRIC,)).aggregate[PRIMARY_METRIC] for w in WEIGHT_GRID}
        best = max(values.values())
        return max(w for w, v in values.items() if v == best), best

    fusion_expected = searched(lambda w: interpolate_runs(dense, lexical, w))
    rerank_expected = searched(lambda w: merge_with_first_stage(interpolate(dense, lexical, w), lexical))[0]
    built = []
    real = evaluation.ir_measures.evaluator
    monkeypatch.setattr(evaluation.ir_measures, "evaluator", lambda *a, **k: built.append(1) or real(*a, **k))
    assert tune_fusion_weight(dense, lexical, qrels, 1) == fusion_expected
    assert len(built) == 1
    assert tune_weight(dense, lexical, qrels, 1) == rerank_expected
    assert len(built) == 2
