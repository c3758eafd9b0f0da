"""Dense training, run once per data-parallel worker in the one epoch loop
(:func:`workloads.training.loop.run_epochs`) through :class:`DenseEpochs`.

Each step: ``batch_size`` rows; the anchors (queries, or sentences) through the query tower,
the positives (their judged documents, or the same sentences under another dropout mask) and,
with ``negatives: bm25``, the hard negatives through the document tower; the training-time
pooler (``dense.pooler``: by default for diffcse one BatchNorm batch over all of them, on the
raw embedding, as the authors); :func:`~workloads.kinds.dense.objectives.in_batch_contrastive`;
with ``objective: diffcse``, plus ``rtd_lambda`` x the conditional RTD loss of the anchors and
the positives, each conditioned on its own embedding. AdamW, linear warm-up and decay,
clipping. After each epoch the encoder re-scores the validation candidates (cosine, the
training similarity); the epoch is chosen on validation nDCG@10, as for every kind.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

from workloads.core.logs import get_logger, progress_bar
from workloads.evaluation import RETRIEVAL_MEASURES, evaluate, validation_values
from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.generator import build_generator
from workloads.kinds.dense.objectives import (
    RAW_INPUT_POOLERS,
    ConditionalDiscriminator,
    build_pooler,
    gathered,
    in_batch_contrastive,
    pool_views,
    replaced_token_detection,
)
from workloads.kinds.dense.spec import MODEL_DIR, DenseSpec, DenseTrialSpec
from workloads.models.cross_encoder import autocast_dtype
from workloads.training.loop import Reporter, agreed, rank_and_world, run_epochs, seed_everything
from workloads.training.step import RunningLoss, adamw, checked_step, data_parallel, optimization_state, start_or_resume

STATE_FILE = "dense_state.pt"
HEADS_FILE = "training_heads.pt"  # the pooler and the discriminator, saved only to resume (dropped at test time)


@dataclass(frozen=True)
class DenseInputs:
    """What a worker reads."""

    training_rows: str          # supervised: the re-ranking training set (query, positive, negative...); else sentences
    unsupervised: bool
    validation_candidates: str  # the first stage's validation candidates (query, doc), re-scored every epoch
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int


def load_encoder(source: str, spec: DenseTrialSpec) -> BiEncoder:
    """The bi-encoder of ``source`` (the model's name, or a checkpoint) as the trial sets it: L2-normalised
    embeddings (the contrastive loss compares cosines, and so does every search of the kept encoder)."""
    return BiEncoder.from_pretrained(source, pooling=spec.model.pooling, normalize=True, shared=spec.model.towers == "shared",
                                     query_max_length=spec.model.query_max_length, document_max_length=spec.model.max_length)


@dataclass
class DenseBatch:
    anchors: dict[str, torch.Tensor]
    positives: dict[str, torch.Tensor]
    negatives: dict[str, torch.Tensor] | None
    anchor_side: str
    draws: torch.Generator  # masks and frequency replacements of this step (seeded: resumable, reproducible)

    def to(self, device: torch.device) -> DenseBatch:
        def moved(inputs):
            return None if inputs is None else {k: v.to(device) for k, v in inputs.items()}

        return DenseBatch(moved(self.anchors), moved(self.positives), moved(self.negatives), self.anchor_side, self.draws)


class _Parts:
    """Where the step reads the loss's named parts (``accumulated_step(parts=...)``)."""

    def __init__(self) -> None:
        self.last_parts: dict[str, torch.Tensor] = {}


class DenseObjective(torch.nn.Module):
    """The bi-encoder, its training-time pooler and (diffcse) the discriminator, with the loss,
    as one module (what data-parallel training wraps). The generator is frozen and not a part."""

    def __init__(self, encoder: BiEncoder, settings: DenseSpec, pooler: torch.nn.Module | None = None,
                 discriminator: ConditionalDiscriminator | None = None, generator=None,
                 amp_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.encoder, self.pooler, self.discriminator = encoder, pooler, discriminator
        self.settings, self.generator, self.amp_dtype = settings, generator, amp_dtype
        self.special_ids = sorted(set(encoder.tokenizer.all_special_ids))
        self.loss_fn = _Parts()

    def embed(self, batch: DenseBatch) -> list[torch.Tensor | None]:
        """The anchors', positives' and negatives' embeddings through the training-time pooler (``dense.pooler``)."""
        raw = self.pooler is not None and self.settings.pooler in RAW_INPUT_POOLERS
        views = [None if inputs is None else self.encoder(side, raw=raw, **inputs).float()
                 for inputs, side in ((batch.anchors, batch.anchor_side), (batch.positives, "document"),
                                      (batch.negatives, "document"))]
        return pool_views(self.pooler, self.settings.pooler == "batchnorm_joint", views)

    def in_batch(self, anchors: torch.Tensor, positives: torch.Tensor,
                 negatives: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The contrastive loss's rows: with ``dense.gather`` while training under more than one worker,
        every worker's (:func:`gathered`), so the in-batch negatives are the global batch's."""
        if not (self.settings.gather and self.training and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            return anchors, positives, negatives
        # every worker takes part in each gather, with or without hard negatives of its own
        negatives = gathered(negatives if negatives is not None else anchors.new_zeros((0, anchors.shape[1])))
        return gathered(anchors), gathered(positives), negatives if negatives.shape[0] else None

    def forward(self, batch: DenseBatch, structure=None) -> torch.Tensor:
        device_type = next(self.encoder.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            anchors, positives, negatives = self.embed(batch)
            contrastive = in_batch_contrastive(*self.in_batch(anchors, positives, negatives), self.settings.temperature)
            parts = {"contrastive": contrastive.detach()}
            loss = contrastive
            if self.discriminator is not None:
                outcomes = [replaced_token_detection(self.discriminator, self.generator, inputs, condition,
                                                     self.settings.masking_ratio, self.special_ids, batch.draws,
                                                     self.settings.rtd_average)
                            for inputs, condition in ((batch.anchors, anchors), (batch.positives, positives))]
                rtd = sum(o.loss for o in outcomes) / len(outcomes)
                loss = loss + self.settings.rtd_lambda * rtd
                parts |= {"rtd": rtd.detach(), "rtd_accuracy": sum(o.accuracy for o in outcomes) / len(outcomes),
                          "rtd_replaced": sum(o.replaced for o in outcomes) / len(outcomes)}
        self.loss_fn.last_parts = parts
        return loss


def training_rows(inputs: DenseInputs) -> list[dict]:
    """Supervised: (query, positive, [negatives]) rows; unsupervised: the sentence twice (dropout positives)."""
    table = pq.read_table(inputs.training_rows)
    if inputs.unsupervised:
        return [{"anchor": s, "positive": s, "negatives": []} for s in table.column("sentence").to_pylist()]
    columns = table.to_pydict()
    many = "negatives" in columns  # training_data.negatives > 1: the list (the first negative included)
    return [{"anchor": q, "positive": p, "negatives": list(columns["negatives"][i]) if many else [columns["negative"][i]]}
            for i, (q, p) in enumerate(zip(columns["query"], columns["positive"]))]


def train_dense(spec: DenseTrialSpec, inputs: DenseInputs, report: Reporter, device: torch.device | None = None,
                resume_from: Path | None = None, stop_requested: Callable[[], bool] | None = None) -> None:
    """Train the bi-encoder and report every epoch (the one epoch loop of every kind)."""
    hooks = DenseEpochs(spec, inputs, device or torch.device("cpu"), resume_from, stop_requested)
    if hooks.stopping.exhausted:
        return
    run_epochs(hooks, range(hooks.first_epoch, spec.dense.epochs + 1), spec.dense.epochs, hooks.stopping, report,
               hooks.rank, hooks.world)


class DenseEpochs:
    """The dense kind's :class:`~workloads.training.loop.EpochHooks`."""

    label = "dense"
    state_file = STATE_FILE

    def __init__(self, spec: DenseTrialSpec, inputs: DenseInputs, device: torch.device, resume_from: Path | None,
                 stop_requested: Callable[[], bool] | None = None):
        self.rank, self.world = rank_and_world()
        self.spec, self.inputs, self.device, self.stop_requested = spec, inputs, device, stop_requested
        dense = self.settings = spec.dense
        seed_everything(spec.seed)
        self.rows = training_rows(inputs)
        encoder = load_encoder(str(Path(resume_from) / MODEL_DIR) if resume_from is not None else spec.model.name, spec)
        pooler = build_pooler(dense.pooler, encoder.hidden_size)
        discriminator = generator = None
        if dense.objective == "diffcse":
            # D starts from the encoder's starting weights (the authors' discriminator is the pretrained BERT too)
            discriminator = ConditionalDiscriminator(copy.deepcopy(encoder.tower("document")))
            texts = [t for row in self.rows for t in (row["anchor"], row["positive"])]
            generator = build_generator(dense.generator, encoder.tokenizer, texts)
            if hasattr(generator, "to"):
                generator = generator.to(device)
        if resume_from is not None and (Path(resume_from) / HEADS_FILE).exists():
            heads = torch.load(Path(resume_from) / HEADS_FILE, map_location="cpu", weights_only=True)
            for module, name in ((pooler, "pooler"), (discriminator, "discriminator")):
                if module is not None:
                    module.load_state_dict(heads[name])
        self.encoder = encoder.to(device)
        self.objective = DenseObjective(encoder, dense, pooler, discriminator, generator,
                                        autocast_dtype(device, spec.precision)).to(device)
        self.wrapped = data_parallel(self.objective, self.world, device, find_unused_parameters=True)
        trainable = [p for p in self.objective.parameters() if p.requires_grad]
        decayed = [p for p in trainable if p.ndim > 1]  # no decay on biases and norms (as transformers' Trainer)
        self.optimizer = adamw([{"params": decayed, "weight_decay": dense.weight_decay},
                                {"params": [p for p in trainable if p.ndim <= 1], "weight_decay": 0.0}], lr=dense.learning_rate)
        self.steps = (len(self.rows) // dense.batch_size) // self.world
        if self.steps == 0:
            raise ValueError(f"{len(self.rows)} training rows make no full batch of {dense.batch_size} per worker x "
                             f"{self.world} workers: lower dense.batch_size or raise training_data.size")
        total = self.steps * dense.epochs
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, int(dense.warmup_ratio * total), total)
        start_or_resume(self, resume_from, dense.patience)
        validation = pq.read_table(inputs.validation_candidates, columns=["query_id", "query", "doc_id", "doc"]).to_pydict()
        self.validation = validation
        what = "sentences (dropout positives)" if inputs.unsupervised else "queries"
        negatives = "BM25 hard + in-batch" if dense.hard_negatives else "in-batch"
        self.say(f"{dense.objective}: {len(self.rows)} {what}, {negatives} negatives, {self.steps} steps/epoch of "
                 f"{dense.batch_size}, tau {dense.temperature}, pooler {dense.pooler}"
                 + (f", gathered over {self.world} workers" if self.world > 1 and dense.gather else "")
                 + (f", lambda {dense.rtd_lambda} (RTD averaged: {dense.rtd_average}), masking {dense.masking_ratio}, "
                    f"generator {dense.generator}"
                    if dense.objective == "diffcse" else "") + f", on {device}")

    def say(self, message: str) -> None:
        if self.rank == 0:
            get_logger("dense").info(message)

    def batch(self, rows: list[dict], epoch: int, step: int) -> DenseBatch:
        encoder, supervised = self.encoder, not self.inputs.unsupervised
        negatives = [n for row in rows for n in row["negatives"]] if self.settings.hard_negatives else []
        draws = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + epoch * 10_007 + step)
        side = "query" if supervised else "document"
        return DenseBatch(encoder.tokenize([r["anchor"] for r in rows], side),
                          encoder.tokenize([r["positive"] for r in rows], "document"),
                          encoder.tokenize(negatives, "document") if negatives else None, side, draws)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        self.wrapped.train()
        order = list(range(len(self.rows)))
        random.Random(self.spec.seed * 1_000 + epoch).shuffle(order)
        size = self.settings.batch_size
        mine = [order[s * size:(s + 1) * size] for s in range(self.rank, self.steps * self.world, self.world)]
        started, total, parts = time.perf_counter(), RunningLoss(self.device), {}
        for step, indices in enumerate(mine, 1):
            batch = self.batch([self.rows[i] for i in indices], epoch, step).to(self.device)
            advice = (f"a dense step of {size} rows does not fit on {self.device}: lower dense.batch_size or "
                      "model.max_length")
            step_parts: dict = {}
            total.add(checked_step(advice, self.wrapped, self.objective, self.optimizer, self.scheduler, self.scaler,
                                   [(batch, None)], self.settings.max_grad_norm, parts=step_parts))
            for name, value in step_parts.items():
                parts[name] = parts.get(name, 0.0) + value
            if self.stop_requested is not None and agreed(self.rank == 0 and self.stop_requested(), self.world):
                self.say(f"stopping in epoch {epoch}, step {step}: requested (pruned)")
                return None
            if step % max(1, len(mine) // 5) == 0 or step == len(mine):
                self.say(f"epoch {epoch} {progress_bar(step, len(mine))} step {step}/{len(mine)} "
                         f"loss {total.value() / step:.4f}")
        return {"epoch": epoch, "train_loss": total.value() / len(mine), "epoch_train_seconds": time.perf_counter() - started,
                **{f"train_{name}": float(value) / len(mine) for name, value in parts.items()}}

    def validate(self, epoch: int) -> dict[str, float]:
        run = rescored_candidates(self.encoder, self.validation, self.settings.eval_batch_size, self.device,
                                  self.spec.precision)
        evaluation = evaluate(run, self.inputs.validation_qrels, self.inputs.relevance_level, RETRIEVAL_MEASURES)
        return validation_values(evaluation)

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        self.encoder.save(checkpoint / MODEL_DIR)
        if not resumable:
            return {}
        heads = {name: module.state_dict() for name, module in (("pooler", self.objective.pooler),
                                                                  ("discriminator", self.objective.discriminator))
                 if module is not None}
        torch.save(heads, checkpoint / HEADS_FILE)
        return optimization_state(self.optimizer, self.scheduler, self.scaler)

    def describe(self, metrics: dict[str, float]) -> str:
        rtd = f", rtd {metrics['train_rtd']:.4f} (accuracy {metrics['train_rtd_accuracy']:.3f})" if "train_rtd" in metrics else ""
        return f" (contrastive {metrics.get('train_contrastive', 0.0):.4f}{rtd})"


def rescored_candidates(encoder: BiEncoder, candidates: dict[str, list], batch_size: int, device: torch.device,
                        precision: str) -> dict[str, dict[str, float]]:
    """Each (query, candidate) of ``candidates`` (columns query_id, query, doc_id, doc) scored by the
    inner product of their embeddings (cosine: the encoder normalises)."""
    queries = dict(zip(candidates["query_id"], candidates["query"]))
    documents = dict(zip(candidates["doc_id"], candidates["doc"]))
    options = {"batch_size": batch_size, "device": device, "precision": precision}
    query_ids, doc_ids = list(queries), list(documents)
    q = dict(zip(query_ids, encoder.encode_queries([queries[i] for i in query_ids], **options)))
    d = dict(zip(doc_ids, encoder.encode_documents([documents[i] for i in doc_ids], **options)))
    run: dict[str, dict[str, float]] = {}
    for qid, doc_id in zip(candidates["query_id"], candidates["doc_id"]):
        run.setdefault(qid, {})[doc_id] = float(q[qid] @ d[doc_id])
    return run


__all__ = ["DenseBatch", "DenseEpochs", "DenseInputs", "DenseObjective", "HEADS_FILE", "MODEL_DIR", "STATE_FILE", "load_encoder",
           "rescored_candidates", "train_dense", "training_rows"]
