"""Re-rank first-stage candidates with a cross-encoder and evaluate the result."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from workloads.collections import Qrels
from workloads.evaluation import Evaluation, evaluate
from workloads.models.cross_encoder import CrossEncoder, score_pairs

Run = dict[str, dict[str, float]]


def rerank_candidates(
    model: CrossEncoder, candidates: Path, batch_size: int = 64, device: torch.device | None = None, label: str = "rerank"
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
            print(f"[{label}] {done:,}/{total:,} pairs ({rate:.1f} pairs/s)", file=sys.stderr, flush=True)

    scores = score_pairs(model, table["query"], table["doc"], batch_size=batch_size, device=device, progress=progress)
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
        rest = sorted(((d, s) for d, s in first_stage.get(qid, {}).items() if d not in top), key=lambda x: (-x[1], x[0]))
        for position, (docid, _) in enumerate(rest, 1):
            top[docid] = floor - position
        merged[qid] = top
    return merged


def rerank_and_evaluate(
    model: CrossEncoder, candidates: Path, first_stage: Run, qrels: Qrels, relevance_level: int,
    batch_size: int = 64, device: torch.device | None = None, label: str = "rerank",
) -> tuple[Evaluation, Run]:
    reranked = rerank_candidates(model, candidates, batch_size, device, label)
    run = merge_with_first_stage(reranked, first_stage)
    return evaluate(run, qrels, relevance_level), run
