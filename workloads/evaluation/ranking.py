"""The one order of a run: trec_eval's, used by every ranking the project writes, cuts or measures.

trec_eval sorts a query's documents by score, descending, and breaks ties by document id,
descending, comparing ids with ``strcmp`` (byte order). Python compares ``str`` by code point,
which is the byte order of their UTF-8, so a plain ``sorted`` of (score, id), reversed, is that
order. ir_measures' providers do not all keep it (its RR@k provider breaks ties by ascending
id), and neither library exposes trec_eval's sort for a run of ours, hence these few lines.
A run is measured in this order (:func:`strictly_ranked`) and every first stage cuts its
ranking to depth k with it, so a tie at the cut is cut the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

Run = dict[str, dict[str, float]]

# Part of the key of every cached run, candidate set and aggregate: a rerun never reuses a ranking
# (or a number measured on one) ordered another way. 2: trec_eval's order (1: ties by ascending id).
TIE_ORDER_VERSION = 2
TIE_ORDER = f"ties-v{TIE_ORDER_VERSION}"


def _by_score_then_id(item: tuple[str, float]) -> tuple[float, str]:
    return item[1], item[0]


def trec_eval_order(scores: Mapping[str, float]) -> list[tuple[str, float]]:
    """A query's (document id, score), best first, ties by document id descending: trec_eval's order."""
    return sorted(scores.items(), key=_by_score_then_id, reverse=True)


def ranked_ids(scores: Mapping[str, float]) -> list[str]:
    """A query's document ids in trec_eval's order."""
    return [doc for doc, _ in trec_eval_order(scores)]


def top_of(scores: Mapping[str, float], k: int | None) -> dict[str, float]:
    """A query's top ``k`` documents (all with ``k`` None) in trec_eval's order, with their scores."""
    return dict(trec_eval_order(scores)[:k])


def strictly_ranked(run: Mapping[str, Mapping[str, float]]) -> Run:
    """``run`` with each query's scores replaced by n, n - 1, ..., 1 in trec_eval's order: no ties
    left, so any evaluator ranks it as trec_eval does (every measure offered depends on ranks only)."""
    out: Run = {}
    for qid, scores in run.items():
        n = len(scores)
        out[qid] = {doc: float(n - i) for i, (doc, _) in enumerate(trec_eval_order(scores))}
    return out


__all__ = ["TIE_ORDER", "TIE_ORDER_VERSION", "ranked_ids", "strictly_ranked", "top_of", "trec_eval_order"]
