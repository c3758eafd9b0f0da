"""Fusing a dense run with a lexical one: reciprocal rank fusion and tuned interpolation.

- **RRF** (Cormack, Clarke and Buettcher, SIGIR 2009): score(d) = sum over runs of
  1 / (k + rank(d)), rank counted from 1 in each run (ties by document id, descending, as
  trec_eval orders them: :mod:`workloads.evaluation.ranking`); a document a run does not retrieve adds nothing from it. k = 60, the paper's.
- **Interpolation**: score(d) = w * dense(d) + (1 - w) * lexical(d), each run's scores
  min-max normalised per query over its own retrieved documents; a document one run does not
  retrieve gets that run's minimum (0). w is given, or tuned on judged queries: the weight of
  :data:`~workloads.evaluation.reranking.WEIGHT_GRID` with the best nDCG@10 (ties keep the
  larger weight, the ranking closer to dense). Dense retrievers are fused with BM25 this way
  (Wang, Zhuang and Zuccon, ICTIR 2021).

Both return each query's fused ranking cut to ``k``.
"""

from __future__ import annotations

from workloads.data.collections import Qrels
from workloads.evaluation import PRIMARY_METRIC, Evaluator
from workloads.evaluation.ranking import ranked_ids, top_of
from workloads.evaluation.reranking import WEIGHT_GRID

Run = dict[str, dict[str, float]]
RRF_K = 60


def reciprocal_rank_fusion(runs: list[Run], k: int | None = None, rrf_k: int = RRF_K) -> Run:
    """RRF of ``runs`` (see the module doc), each query's fused ranking cut to ``k``."""
    if rrf_k < 1:
        raise ValueError(f"rrf_k must be at least 1, got {rrf_k}")
    fused: Run = {}
    for qid in sorted({q for run in runs for q in run}):
        scores: dict[str, float] = {}
        for run in runs:
            for rank, doc in enumerate(ranked_ids(run.get(qid, {})), 1):
                scores[doc] = scores.get(doc, 0.0) + 1.0 / (rrf_k + rank)
        if scores:
            fused[qid] = top_of(scores, k)
    return fused


def _min_max(scores: dict[str, float]) -> dict[str, float]:
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    if high == low:
        return {doc: 0.0 for doc in scores}
    return {doc: (s - low) / (high - low) for doc, s in scores.items()}


def interpolate_runs(dense: Run, lexical: Run, weight: float, k: int | None = None) -> Run:
    """w * dense + (1 - w) * lexical over the union of both runs' documents (see the module doc)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"interpolation weight must be in [0, 1], got {weight}")
    fused: Run = {}
    for qid in sorted(set(dense) | set(lexical)):
        a, b = _min_max(dense.get(qid, {})), _min_max(lexical.get(qid, {}))
        scores = {doc: weight * a.get(doc, 0.0) + (1.0 - weight) * b.get(doc, 0.0) for doc in set(a) | set(b)}
        if scores:
            fused[qid] = top_of(scores, k)
    return fused


def tune_fusion_weight(dense: Run, lexical: Run, qrels: Qrels, relevance_level: int = 1, k: int | None = None) -> tuple[float, float]:
    """(weight, its nDCG@10) of the grid weight fusing best on ``qrels``' queries (one evaluator
    scores every weight: built per weight, it read the qrels 21 times)."""
    evaluator = Evaluator(qrels, relevance_level, (PRIMARY_METRIC,))
    best_weight, best_value = 1.0, float("-inf")
    for weight in sorted(WEIGHT_GRID, reverse=True):
        value = evaluator(interpolate_runs(dense, lexical, weight, k)).aggregate[PRIMARY_METRIC]
        if value > best_value:
            best_weight, best_value = weight, value
    return best_weight, best_value


__all__ = ["RRF_K", "interpolate_runs", "reciprocal_rank_fusion", "tune_fusion_weight"]
