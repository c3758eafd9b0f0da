"""Re-rank first-stage candidates with a cross-encoder, optionally fuse with the first stage, evaluate.

Interpolation: score(q, d) = w * CE(q, d) + (1 - w) * BM25(q, d), both min-max normalised
per query over the re-ranked documents. Re-rankers trained on little in-domain data are
routinely fused with the first stage this way (Wang, Zhuang and Zuccon, *BERT-based Dense
Retrievers Require Interpolation with BM25*, ICTIR 2021; Pradeep et al., *Squeezing Water
from a Stone*, ECIR 2022), because the two make different mistakes. w = 1 is the
cross-encoder alone, w = 0 the first stage alone. A tuned w is chosen on the validation
queries only, from :data:`WEIGHT_GRID`. Written here because it is a
few lines on our run dictionaries; neither ir_measures nor Pyserini fuses runs with a tuned
weight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch

from workloads.core.logs import get_logger
from workloads.data.collections import Qrels
from workloads.evaluation import PRIMARY_METRIC, Evaluation, Evaluator, evaluate
from workloads.evaluation.ranking import trec_eval_order
from workloads.models.cross_encoder import CrossEncoder, score_pairs

Run = dict[str, dict[str, float]]

WEIGHT_GRID = tuple(i / 20 for i in range(21))  # 0.00, 0.05, ..., 1.00


def rerank_candidates(
    model: CrossEncoder, candidates: Path, batch_size: int = 64, device: torch.device | None = None, label: str = "rerank",
    precision: str = "auto",
) -> Run:
    """Score every (query, candidate) of a candidates Parquet file; returns the re-ranked run."""
    table = pq.read_table(candidates).to_pydict()
    started = time.perf_counter()
    last_print = [started]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if now - last_print[0] >= 30 or done == total:
            last_print[0] = now
            rate = done / max(now - started, 1e-9)
            get_logger("score").info(f"{label}: {done:,}/{total:,} pairs ({rate:.1f} pairs/s)")

    # tokenized once per (candidates, tokenizer, max length): every epoch's validation and
    # every winner's test read the same stored ids
    tokenized = model.tokenized(table["query"], table["doc"])
    scores = score_pairs(model, table["query"], table["doc"], batch_size=batch_size, device=device, progress=progress,
                         precision=precision, tokenized=tokenized)
    run: Run = {}
    for qid, docid, score in zip(table["query_id"], table["doc_id"], scores):
        run.setdefault(qid, {})[docid] = score
    return run


def merge_with_first_stage(reranked: Run, first_stage: Run) -> Run:
    """Re-ranked candidates on top, the rest of the first-stage ranking below them, in order.

    The first-stage documents below the re-ranking depth keep their order and get scores
    under the lowest re-ranked score, so measures deeper than the depth stay comparable.
    """
    merged: Run = {}
    for qid in set(reranked) | set(first_stage):
        top = dict(reranked.get(qid, {}))
        floor = min(top.values(), default=0.0)
        rest = [(d, s) for d, s in trec_eval_order(first_stage.get(qid, {})) if d not in top]
        for position, (docid, _) in enumerate(rest, 1):
            top[docid] = floor - position
        merged[qid] = top
    return merged


def _min_max(scores: dict[str, float]) -> dict[str, float]:
    low, high = min(scores.values()), max(scores.values())
    if high == low:  # one candidate, or all tied: this ranker expresses no preference
        return {doc: 0.0 for doc in scores}
    return {doc: (s - low) / (high - low) for doc, s in scores.items()}


def interpolate(reranked: Run, first_stage: Run, weight: float) -> Run:
    """Fuse the re-ranked documents' scores with their first-stage scores (see the module doc).

    Returns only the re-ranked documents, each of which must be in the first-stage run.
    """
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"interpolation weight must be in [0, 1], got {weight}")
    fused: Run = {}
    for qid, scores in reranked.items():
        if not scores:
            continue
        first = first_stage.get(qid, {})
        missing = [doc for doc in scores if doc not in first]
        if missing:
            raise ValueError(f"query {qid}: re-ranked document {missing[0]} is not in the first-stage run")
        model, lexical = _min_max(scores), _min_max({doc: first[doc] for doc in scores})
        fused[qid] = {doc: weight * model[doc] + (1.0 - weight) * lexical[doc] for doc in scores}
    return fused


def tune_weight(reranked: Run, first_stage: Run, qrels: Qrels, relevance_level: int) -> float:
    """The grid weight whose final ranking has the best nDCG@10 on these (validation) queries.

    Ties keep the larger weight: the ranking closer to the plain re-ranker. One evaluator scores
    every weight (built per weight, it read the qrels 21 times).
    """
    evaluator = Evaluator(qrels, relevance_level, (PRIMARY_METRIC,))
    best_weight, best_value = 1.0, float("-inf")
    for weight in sorted(WEIGHT_GRID, reverse=True):
        fused = merge_with_first_stage(interpolate(reranked, first_stage, weight), first_stage)
        value = evaluator(fused).aggregate[PRIMARY_METRIC]
        if value > best_value:
            best_weight, best_value = weight, value
    return best_weight


@dataclass(frozen=True)
class Reranking:
    """The final ranking's evaluation and run; with interpolation, the weight used and the
    evaluation of the cross-encoder alone (None without interpolation: it is ``evaluation``)."""

    evaluation: Evaluation
    run: Run
    weight: float | None = None
    cross_encoder: Evaluation | None = None


def rerank_and_evaluate(
    model: CrossEncoder, candidates: Path, first_stage: Run, qrels: Qrels, relevance_level: int,
    batch_size: int = 64, device: torch.device | None = None, label: str = "rerank",
    interpolation: float | str = "none", precision: str = "auto",
) -> Reranking:
    """Re-rank and evaluate; ``interpolation`` is "none", "tuned" (choose w on these queries:
    validation only) or a fixed weight w in [0, 1]; ``precision`` the trial's (scoring uses
    the same autocast as training)."""
    reranked = rerank_candidates(model, candidates, batch_size, device, label, precision)
    plain = merge_with_first_stage(reranked, first_stage)
    if interpolation == "none":
        return Reranking(evaluate(plain, qrels, relevance_level), plain)
    weight = tune_weight(reranked, first_stage, qrels, relevance_level) if interpolation == "tuned" else float(interpolation)
    fused = merge_with_first_stage(interpolate(reranked, first_stage, weight), first_stage)
    return Reranking(evaluate(fused, qrels, relevance_level), fused, weight, evaluate(plain, qrels, relevance_level))
