"""Selector training (select-and-rank), run once per data-parallel worker in the one epoch loop
(:func:`workloads.training.loop.run_epochs`) through :class:`SelectorEpochs`, like the
cross-encoder's (:mod:`workloads.kinds.rerank.train`): workers report one record per epoch with
its checkpoint. What they read, :class:`SelectorInputs`, is prepared on the driver
(:mod:`workloads.kinds.selector.steps`, which also tests the chosen epoch and installs it).

Each step: a batch of training triples -> (q, d+) and (q, d-) pairs; the selector scores
every sentence of each document, the relaxed top-k picks ``k`` (seeded Gumbel noise per
step), the ranker scores the pair on them; the ranking loss of the registry (pointwise
BCE, or the pairwise hinge) trains both. AdamW, linear warm-up for ``warmup_steps`` then
constant, gradient clipping at 1. After each epoch the select-and-rank model re-ranks the
validation candidates (deterministic top-k); training stops after ``patience`` epochs
without a better validation nDCG@10 (the reference stops on MAP; every epoch of this
project is chosen on nDCG@10, so early stopping watches the same number).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
from transformers import get_constant_schedule_with_warmup

from workloads.core.logs import get_logger, progress_bar
from workloads.evaluation import evaluate, validation_values
from workloads.evaluation.reranking import Reranking, merge_with_first_stage
from workloads.kinds.rerank.batching import triples_to_batch
from workloads.kinds.selector.select_and_rank import SelectAndRank
from workloads.kinds.selector.spec import SelectorTrialSpec
from workloads.losses import ModelOutputs, PairLoss, build_ranking_loss
from workloads.models.cross_encoder import autocast_dtype
from workloads.retrieval.bm25 import read_trec_run
from workloads.training.loop import Reporter, rank_and_world, run_epochs, seed_everything
from workloads.training.step import RunningLoss, adamw, checked_step, data_parallel, optimization_state, start_or_resume

STATE_FILE = "selector_state.pt"


@dataclass(frozen=True)
class SelectorInputs:
    """What a worker reads: the training set, validation candidates and judgements, and the
    sentences of every document it will see."""

    training_set: str
    validation_candidates: str
    validation_first_stage_run: str
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int
    sentences: str


def load_sentences(path: str) -> dict[str, list[str]]:
    table = pq.read_table(path).to_pydict()
    return dict(zip(table["doc_id"], table["sentences"]))


def rerank_with_selector(model: SelectAndRank, candidates: Path, first_stage: dict, qrels, relevance_level: int,
                         sentences: dict[str, list[str]], batch_size: int, label: str) -> Reranking:
    """Re-rank first-stage candidates with the select-and-rank model (deterministic top-k)."""
    table = pq.read_table(candidates, columns=["query_id", "query", "doc_id"]).to_pydict()
    started, last = time.perf_counter(), [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] >= 30 or done == total:
            last[0] = time.perf_counter()
            get_logger("score").info(f"{label}: {done:,}/{total:,} pairs ({done / max(last[0] - started, 1e-9):.1f} pairs/s)")

    scores = model.score_pairs(table["query"], [sentences[d] for d in table["doc_id"]], table["doc_id"], batch_size, progress)
    reranked: dict[str, dict[str, float]] = {}
    for qid, doc_id, score in zip(table["query_id"], table["doc_id"], scores):
        reranked.setdefault(qid, {})[doc_id] = score
    ranking = merge_with_first_stage(reranked, first_stage)
    return Reranking(evaluate(ranking, qrels, relevance_level), ranking)


def parameter_groups(model: SelectAndRank, learning_rate: float, selector_learning_rate: float | None) -> list[dict]:
    """The ranker (and the embeddings it shares) at ``learning_rate``; the selector's own
    parameters at ``selector_learning_rate`` (default: the same)."""
    shared = {id(p) for p in model.ranker.parameters()}
    own = [p for p in model.selector.parameters() if p.requires_grad and id(p) not in shared]
    ranker = [p for p in model.ranker.parameters() if p.requires_grad]
    return [{"params": ranker, "lr": learning_rate}, {"params": own, "lr": selector_learning_rate or learning_rate}]


class SelectorObjective(torch.nn.Module):
    """The select-and-rank model and its ranking loss as one module (what data-parallel training
    wraps): ``inputs`` is a batch of documents' sentences and the step's Gumbel generator."""

    def __init__(self, model: SelectAndRank, loss_fn: PairLoss, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.loss_fn, self.amp_dtype = model, loss_fn, amp_dtype

    def forward(self, inputs: tuple, structure) -> torch.Tensor:
        batch, generator = inputs
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            scores, phi = self.model(batch, generator)
        return self.loss_fn(ModelOutputs(scores.float(), phi.float()), structure)


def train_selector(spec: SelectorTrialSpec, inputs: SelectorInputs, report: Reporter, device: torch.device | None = None,
                   resume_from: Path | None = None) -> None:
    """Train a selector with the ranker it feeds and report every epoch, in the one epoch loop
    (:func:`workloads.training.loop.run_epochs`); ``resume_from`` is the last reported checkpoint."""
    hooks = SelectorEpochs(spec, inputs, device or torch.device("cpu"), resume_from)
    if hooks.stopping.exhausted:
        return  # it had stopped early: nothing left to train
    run_epochs(hooks, range(hooks.first_epoch, spec.selector.epochs + 1), spec.selector.epochs, hooks.stopping, report,
               hooks.rank, hooks.world)


class SelectorEpochs:
    """The selector kind's :class:`~workloads.training.loop.EpochHooks`."""

    label = "selector"
    state_file = STATE_FILE

    def __init__(self, spec: SelectorTrialSpec, inputs: SelectorInputs, device: torch.device, resume_from: Path | None):
        self.rank, self.world = rank_and_world()
        self.spec, self.inputs, self.device = spec, inputs, device
        sel = self.sel = spec.selector
        seed_everything(spec.seed)
        if resume_from is not None:
            model = SelectAndRank.load(resume_from, spec.model.max_length)
        else:
            model = SelectAndRank.build(spec.method, sel, spec.model.name, spec.model.max_length, spec.model.pooling)
        self.model = model.to(device)
        loss_fn = build_ranking_loss(sel.loss, **({"margin": sel.margin} if sel.loss == "pairwise" else {}))
        self.objective = SelectorObjective(self.model, loss_fn, autocast_dtype(device, spec.precision))
        self.wrapped = data_parallel(self.objective, self.world, device, find_unused_parameters=True)
        self.optimizer = adamw(parameter_groups(self.model, sel.learning_rate, sel.selector_learning_rate))
        self.scheduler = get_constant_schedule_with_warmup(self.optimizer, sel.warmup_steps)
        start_or_resume(self, resume_from, sel.patience)
        self.triples = pq.read_table(inputs.training_set).to_pylist()
        self.sentences = load_sentences(inputs.sentences)
        self.per_batch = sel.batch_size // 2
        self.steps = (len(self.triples) // self.per_batch) // self.world
        if self.steps == 0:
            raise ValueError(f"{len(self.triples)} triples make no full batch of {self.per_batch} triples per worker x "
                             f"{self.world} workers")
        self.validation_run = read_trec_run(Path(inputs.validation_first_stage_run))
        self.say(f"{spec.method} selector: {len(self.triples)} triples, {self.steps} steps/epoch, at most {sel.epochs} "
                 f"epochs (patience {sel.patience}), k = {sel.k}, tau = {sel.tau}, on {device}")

    def say(self, message: str) -> None:
        if self.rank == 0:
            get_logger("selector").info(message)

    def train_epoch(self, epoch: int) -> dict[str, float]:
        self.wrapped.train()
        order = list(range(len(self.triples)))
        random.Random(self.spec.seed * 1_000 + epoch).shuffle(order)
        per_batch = self.per_batch
        mine = [order[b * per_batch:(b + 1) * per_batch] for b in range(self.rank, self.steps * self.world, self.world)]
        started, total = time.perf_counter(), RunningLoss(self.device)  # read when logged: no per-step wait
        for step, rows_index in enumerate(mine, 1):
            rows = [self.triples[i] for i in rows_index]
            structure = triples_to_batch(rows).structure.to(self.device)  # pairs: (q, d+), (q, d-) per triple
            doc_ids = [d for r in rows for d in (r["positive_id"], r["negative_id"])]
            batch = self.model.batch([r["query"] for r in rows for _ in (0, 1)], [self.sentences[d] for d in doc_ids],
                                     doc_ids).to(self.device)
            # Arithmetic, not workloads.core.seeds: with hashed seeds the linear selector did not learn the
            # constructed task of its test in 5 epochs (0.0 -> 0.0); these collide only past 10,007 steps.
            generator = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + epoch * 10_007 + step)
            advice = (f"a selector step of {len(doc_ids)} documents of up to {self.sel.max_sentences} sentences does not "
                      f"fit on {self.device}: lower augmentation.selector.batch_size or max_sentences")
            total.add(checked_step(advice, self.wrapped, self.objective, self.optimizer, self.scheduler, self.scaler,
                                   [((batch, generator), structure)], 1.0))
            if self.rank == 0 and (step % max(1, len(mine) // 5) == 0 or step == len(mine)):
                self.say(f"selector epoch {epoch} {progress_bar(step, len(mine))} step {step}/{len(mine)} "
                         f"loss {total.value() / step:.4f}")
        return {"epoch": epoch, "train_loss": total.value() / len(mine), "epoch_train_seconds": time.perf_counter() - started}

    def validate(self, epoch: int) -> dict[str, float]:
        validation = rerank_with_selector(self.model, Path(self.inputs.validation_candidates), self.validation_run,
                                          self.inputs.validation_qrels, self.inputs.relevance_level, self.sentences,
                                          self.sel.eval_batch_size, f"validate selector epoch {epoch}")
        return validation_values(validation.evaluation)

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        self.model.save(checkpoint)
        if not resumable:
            return {}
        return optimization_state(self.optimizer, self.scheduler, self.scaler)

    def describe(self, metrics: dict[str, float]) -> str:
        return f" (best {self.stopping.best:.4f}, {self.stopping.stale} epoch(s) without improvement)"


__all__ = ["STATE_FILE", "SelectorEpochs", "SelectorInputs", "SelectorObjective", "load_sentences", "parameter_groups",
           "rerank_with_selector", "train_selector"]
