"""The EAR trial's training, run once per data-parallel worker in the one epoch loop
(:func:`workloads.training.loop.run_epochs`) through :class:`EarEpochs`, and the choice of each
query's expansion it learns (what validation, the test and the kept run read too).

A cross-encoder M scores every (q, e_i) (RI) or (q e_i, d_i) (RD) of a step's queries; M
estimates the rank (lower is better), trained with EAR's pairwise margin loss
(:func:`workloads.kinds.ear.loss.ear_loss`). Each epoch is validated by the retrieval quality
of the chosen expansions (validation nDCG@10 chooses the epoch, as for every kind). The
prepared rows and rankings it reads are :mod:`workloads.kinds.ear.steps`'s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import get_constant_schedule_with_warmup

from workloads.core.logs import get_logger, progress_bar
from workloads.evaluation import RETRIEVAL_MEASURES, evaluate, validation_values
from workloads.kinds.ear.loss import ear_loss
from workloads.kinds.ear.spec import EarTrialSpec
from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, score_pairs
from workloads.training.loop import Reporter, agreed, rank_and_world, run_epochs, seed_everything
from workloads.training.step import adamw, checked_step, data_parallel, optimization_state, start_or_resume

STATE_FILE = "ear_state.pt"

Run = dict[str, dict[str, float]]


@dataclass(frozen=True)
class EarInputs:
    """What a worker reads."""

    training_rows: str
    validation_rows: str
    validation_rankings: str
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int



# ----------------------------------------------------------------------------- choosing


def pair_texts(reranker: str, separator: str, rows: dict[str, list]) -> tuple[list[str], list[str]]:
    """The reranker's input pairs of ``rows`` (columns of :data:`workloads.kinds.ear.steps.ROWS_SCHEMA`):
    RI reads (q, e_i); RD reads (q [SEP] e_i, d_i), the expanded query against the document it
    retrieves first."""
    if reranker == "ri":
        return list(rows["query"]), list(rows["expansion"])
    firsts = [f"{q} {separator} {e}".strip() for q, e in zip(rows["query"], rows["expansion"])]
    return firsts, list(rows["top_document"])


def _separator(model: CrossEncoder) -> str:
    return model.tokenizer.sep_token or "|"


def chosen_expansions(model: CrossEncoder, reranker: str, rows_path: str, batch_size: int, precision: str,
                      label: str, device: torch.device | None = None) -> dict[str, int]:
    """Each query's expansion with the lowest M (the best estimated rank; the first among ties)."""
    rows = pq.read_table(rows_path, columns=["query_id", "query", "expansion_index", "expansion", "top_document"]).to_pydict()
    firsts, seconds = pair_texts(reranker, _separator(model), rows)
    started, last = time.perf_counter(), [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] >= 30 or done == total:
            last[0] = time.perf_counter()
            get_logger("score").info(f"{label}: {done:,}/{total:,} expansions ({done / max(last[0] - started, 1e-9):.1f}/s)")

    scores = score_pairs(model, firsts, seconds, batch_size, device, progress, precision)
    best: dict[str, tuple[float, int]] = {}
    for qid, index, score in zip(rows["query_id"], rows["expansion_index"], scores):
        if qid not in best or (score, index) < best[qid]:
            best[qid] = (score, index)
    return {qid: index for qid, (_, index) in best.items()}


def chosen_run(rankings_path: str, chosen: dict[str, int]) -> Run:
    """The BM25 rankings of the chosen expansions (a query whose expansion retrieved nothing is absent)."""
    # Joined in Arrow: only the chosen 1/n of the rows (n expansions x depth hits per query)
    # become Python objects, in every epoch's validation too.
    wanted = pa.table({"query_id": pa.array(list(chosen), pa.string()),
                       "expansion_index": pa.array(list(chosen.values()), pa.int32())})
    table = pq.read_table(rankings_path, columns=["query_id", "expansion_index", "doc_id", "score"]).join(
        wanted, ["query_id", "expansion_index"], join_type="inner")
    run: Run = {}
    for qid, doc_id, score in zip(*(table.column(c).to_pylist() for c in ("query_id", "doc_id", "score"))):
        run.setdefault(qid, {})[doc_id] = score
    return run


# ----------------------------------------------------------------------------- train


class EarObjective(torch.nn.Module):
    """The reranker and EAR's loss as one module (what data-parallel training wraps): ``inputs``
    is the step's pairs, ``ranks`` their labels (queries x expansions)."""

    def __init__(self, model: CrossEncoder, alpha: float, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.alpha, self.amp_dtype = model, alpha, amp_dtype

    def forward(self, inputs: dict[str, torch.Tensor], ranks: torch.Tensor) -> torch.Tensor:
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            scores, _ = self.model(**inputs)
        return ear_loss(scores.float().view(ranks.shape), ranks, self.alpha)


def training_groups(rows_path: str, max_rank: int) -> list[tuple[list[int], torch.Tensor]]:
    """(row indices, labels) per training query whose expansions do not all tie: a query whose
    labels are all equal has no pair, so no loss."""
    table = pq.read_table(rows_path, columns=["query_id", "rank"]).to_pydict()
    by_query: dict[str, list[int]] = {}
    for i, qid in enumerate(table["query_id"]):
        by_query.setdefault(qid, []).append(i)
    groups = []
    for indices in by_query.values():
        labels = [table["rank"][i] or max_rank for i in indices]
        if len(set(labels)) > 1:
            groups.append((indices, torch.tensor(labels, dtype=torch.float32)))
    return groups


def train_ear(spec: EarTrialSpec, inputs: EarInputs, report: Reporter, device: torch.device | None = None,
              resume_from: Path | None = None, stop_requested: Callable[[], bool] | None = None) -> None:
    """Train the query reranker and report every epoch (the one epoch loop of every kind).
    ``stop_requested`` (asked by rank 0 after every step, agreed by all workers) ends training
    early: a sweep's pruner stopping the trial."""
    hooks = EarEpochs(spec, inputs, device or torch.device("cpu"), resume_from, stop_requested)
    if hooks.stopping.exhausted:
        return
    run_epochs(hooks, range(hooks.first_epoch, spec.ear.epochs + 1), spec.ear.epochs, hooks.stopping, report,
               hooks.rank, hooks.world)


class EarEpochs:
    """The EAR kind's :class:`~workloads.training.loop.EpochHooks`."""

    label = "ear"
    state_file = STATE_FILE

    def __init__(self, spec: EarTrialSpec, inputs: EarInputs, device: torch.device, resume_from: Path | None,
                 stop_requested: Callable[[], bool] | None = None):
        self.rank, self.world = rank_and_world()
        self.spec, self.inputs, self.device, self.stop_requested = spec, inputs, device, stop_requested
        ear = spec.ear
        seed_everything(spec.seed)
        source = str(resume_from) if resume_from is not None else spec.model.name
        self.model = CrossEncoder.from_pretrained(source, spec.model.max_length, spec.model.pooling).to(device)
        self.objective = EarObjective(self.model, ear.alpha, autocast_dtype(device, spec.precision))
        self.wrapped = data_parallel(self.objective, self.world, device)
        self.optimizer = adamw([{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": ear.learning_rate}])
        self.scheduler = get_constant_schedule_with_warmup(self.optimizer, ear.warmup_steps)
        start_or_resume(self, resume_from, ear.patience)
        self.rows = pq.read_table(inputs.training_rows).to_pydict()
        self.groups = training_groups(inputs.training_rows, ear.max_rank)
        self.steps = (len(self.groups) // ear.queries_per_step) // self.world
        if self.steps == 0:
            raise ValueError(f"{len(self.groups)} training queries whose expansions rank differently make no step of "
                             f"{ear.queries_per_step} queries per worker x {self.world} workers")
        self.say(f"EAR-{ear.reranker.upper()}: {len(self.groups)} training queries with a choice to learn, "
                 f"{self.steps} steps/epoch of {ear.queries_per_step} queries x {spec.expansion.n} expansions, "
                 f"alpha {ear.alpha}, MAX_RANK {ear.max_rank}, on {device}")

    def say(self, message: str) -> None:
        if self.rank == 0:
            get_logger("ear").info(message)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        self.wrapped.train()
        order = list(range(len(self.groups)))
        random.Random(self.spec.seed * 1_000 + epoch).shuffle(order)
        per_step = self.spec.ear.queries_per_step
        mine = [order[s * per_step:(s + 1) * per_step] for s in range(self.rank, self.steps * self.world, self.world)]
        separator = _separator(self.model)
        started, total = time.perf_counter(), 0.0
        for step, group_indices in enumerate(mine, 1):
            groups = [self.groups[g] for g in group_indices]
            indices = [i for row_indices, _ in groups for i in row_indices]
            rows = {column: [self.rows[column][i] for i in indices] for column in ("query", "expansion", "top_document")}
            firsts, seconds = pair_texts(self.spec.ear.reranker, separator, rows)
            pairs = self.model.encode(firsts, seconds).to(self.device)
            ranks = torch.stack([labels for _, labels in groups]).to(self.device)
            advice = (f"an EAR step of {len(indices)} pairs does not fit on {self.device}: lower ear.queries_per_step or "
                      "model.max_length")
            total += float(checked_step(advice, self.wrapped, self.objective, self.optimizer, self.scheduler, self.scaler,
                                        [(pairs.inputs, ranks)], 1.0))
            if self.stop_requested is not None and agreed(self.rank == 0 and self.stop_requested(), self.world):
                self.say(f"stopping in epoch {epoch}, step {step}: requested (pruned)")
                return None
            if step % max(1, len(mine) // 5) == 0 or step == len(mine):
                self.say(f"epoch {epoch} {progress_bar(step, len(mine))} step {step}/{len(mine)} loss {total / step:.4f}")
        return {"epoch": epoch, "train_loss": total / len(mine), "epoch_train_seconds": time.perf_counter() - started}

    def validate(self, epoch: int) -> dict[str, float]:
        chosen = chosen_expansions(self.model, self.spec.ear.reranker, self.inputs.validation_rows,
                                   self.spec.ear.eval_batch_size, self.spec.precision, f"validate EAR epoch {epoch}",
                                   self.device)
        evaluation = evaluate(chosen_run(self.inputs.validation_rankings, chosen), self.inputs.validation_qrels,
                              self.inputs.relevance_level, RETRIEVAL_MEASURES)
        return validation_values(evaluation)

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        self.model.save(checkpoint)
        if not resumable:
            return {}
        return optimization_state(self.optimizer, self.scheduler, self.scaler)

    def describe(self, metrics: dict[str, float]) -> str:
        return f" (recall@100 {metrics.get('val_recall_at_100', 0.0):.4f})"


__all__ = ["STATE_FILE", "EarEpochs", "EarInputs", "EarObjective", "Run", "chosen_expansions", "chosen_run",
           "pair_texts", "train_ear", "training_groups"]
