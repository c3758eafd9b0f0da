"""Evaluation with ir_measures (trec_eval-equivalent: pytrec_eval underneath).

Every run is measured in trec_eval's order (score descending, ties by document id descending:
:mod:`workloads.evaluation.ranking`): its ties are broken before ir_measures sees it, because
not every ir_measures provider breaks them as trec_eval does (RR@k's orders them by ascending
id). Each measure of :data:`MEASURES` equals pytrec_eval's on runs with ties (a test per measure).

nDCG uses the graded judgements as gains. Binary measures (AP, RR, P) count a document as
relevant when its grade is >= the collection's ``relevance_level`` (1 for BEIR, 2 for
TREC-DL, as trec_eval's ``-l``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import ir_measures

from workloads.data.collections import Qrels
from workloads.evaluation.ranking import strictly_ranked

Run = dict[str, dict[str, float]]

# Our metric name -> ir_measures measure (filled with the relevance level at call time).
MEASURES: dict[str, str] = {
    "ndcg_at_10": "nDCG@10",
    "ndcg_at_20": "nDCG@20",
    "rr_at_10": "RR(rel={rel})@10",
    "rr_at_100": "RR(rel={rel})@100",
    "ap": "AP(rel={rel})",
    "map_at_20": "AP(rel={rel})@20",
    "p_at_1": "P(rel={rel})@1",
    # first-stage quality (query expansion): recall, and top-k accuracy (a relevant document in the top k)
    "recall_at_100": "R(rel={rel})@100",
    "recall_at_1000": "R(rel={rel})@1000",
    "success_at_5": "Success(rel={rel})@5",
    "success_at_20": "Success(rel={rel})@20",
    "success_at_100": "Success(rel={rel})@100",
}
# What a trial measures on every target (the measures above the comment; the others are asked for)
RERANKING_MEASURES = ("ndcg_at_10", "ndcg_at_20", "rr_at_10", "rr_at_100", "ap", "map_at_20", "p_at_1")
RETRIEVAL_MEASURES = ("ndcg_at_10", "recall_at_100", "success_at_5", "success_at_20", "success_at_100")
PRIMARY_METRIC = "ndcg_at_10"
DISPLAY_NAMES = {
    "ndcg_at_10": "nDCG@10", "ndcg_at_20": "nDCG@20", "rr_at_10": "RR@10", "rr_at_100": "RR@100",
    "ap": "AP", "map_at_20": "MAP@20", "p_at_1": "P@1", "recall_at_100": "R@100", "recall_at_1000": "R@1000", "success_at_5": "S@5",
    "success_at_20": "S@20", "success_at_100": "S@100",
}


# How an aggregate is summed from its per-query values; part of the key of every cache of
# aggregates, so that no rerun mixes digits of two summations. 2: math.fsum (1: the built-in sum).
AGGREGATE_VERSION = 2


def mean_of(values: Iterable[float]) -> float:
    """The mean of floats from their correctly rounded sum: the same digits on every Python (the
    built-in ``sum()`` of floats is compensated from 3.12, so its last digits depend on the
    interpreter) and in every order. Every reported mean is this one. Raises on no values."""
    values = list(values)
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class Evaluation:
    """Aggregates (mean over the judged queries) and the per-query values behind them."""

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]  # metric -> query id -> value
    relevance_level: int
    num_queries: int


# An epoch's validation value of each query, in query-id order (a list: Tune flattens the dicts
# in the results it hands on): what a sweep's Wilcoxon pruner compares two trials on, query by
# query. Not a ``val_*`` name, so it is never logged as a metric nor summarised as ``best_val_*``.
SELECTION_PER_QUERY = f"per_query_val_{PRIMARY_METRIC}"


def validation_values(evaluation: Evaluation) -> dict:
    """An epoch's validation as every trial kind reports it: the ``val_*`` aggregates and
    :data:`SELECTION_PER_QUERY`."""
    per_query = evaluation.per_query.get(PRIMARY_METRIC, {})
    return {**{f"val_{k}": v for k, v in evaluation.aggregate.items()},
            **({SELECTION_PER_QUERY: [per_query[q] for q in sorted(per_query)]} if per_query else {})}


class Evaluator:
    """The measures ``metrics`` on ``qrels`` at ``relevance_level``, built once (ir_measures reads
    the qrels once) and called on as many runs as needed: a weight search scores 21 runs on one."""

    def __init__(self, qrels: Qrels, relevance_level: int = 1, metrics: tuple[str, ...] = RERANKING_MEASURES):
        parsed = {name: ir_measures.parse_measure(MEASURES[name].format(rel=relevance_level)) for name in metrics}
        self._by_measure = {measure: name for name, measure in parsed.items()}
        self._evaluator = ir_measures.evaluator(list(parsed.values()), qrels)
        self.qrels, self.relevance_level, self.metrics = qrels, relevance_level, metrics

    def __call__(self, run: Run) -> Evaluation:
        """Score ``run``; queries judged but absent from the run score 0.

        Queries without any judgement are ignored (trec_eval's default); queries judged but
        with no retrieved document count as 0, so a run that drops queries cannot look better.
        """
        per_query: dict[str, dict[str, float]] = {name: {qid: 0.0 for qid in self.qrels} for name in self.metrics}
        judged_run = strictly_ranked({qid: docs for qid, docs in run.items() if qid in self.qrels and docs})
        for metric in self._evaluator.iter_calc(judged_run):
            per_query[self._by_measure[metric.measure]][metric.query_id] = float(metric.value)
        n = len(self.qrels)
        aggregate = {name: (mean_of(values.values()) if n else 0.0) for name, values in per_query.items()}
        return Evaluation(aggregate=aggregate, per_query=per_query, relevance_level=self.relevance_level, num_queries=n)


def evaluate(run: Run, qrels: Qrels, relevance_level: int = 1, metrics: tuple[str, ...] = RERANKING_MEASURES) -> Evaluation:
    """Score ``run`` against ``qrels`` (see :class:`Evaluator`, built here for this one run)."""
    return Evaluator(qrels, relevance_level, metrics)(run)


def format_metrics(aggregate: dict[str, float]) -> str:
    return "  ".join(f"{DISPLAY_NAMES.get(k, k)} {v:.4f}" for k, v in aggregate.items())
