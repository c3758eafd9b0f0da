"""The cross-encoder training loop, run once per data-parallel worker.

Framework-free on purpose: the orchestrator runs it inside Ray Train workers (which set up
``torch.distributed``), tests run it in-process. It reports one record per epoch through a
callback, with the epoch's checkpoint directory (on rank 0) so the caller can persist it.

AdamW with linear warmup and decay, gradient clipping, bf16/fp16 autocast on GPU, dynamic
padding, validation after each epoch by re-ranking the first-stage top-k.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

from workloads.batches import triples_to_batch
from workloads.retrieval.bm25 import read_trec_run
from workloads.evaluation import PRIMARY_METRIC
from workloads.losses import ModelOutputs, RankingWithContrastive, build_loss
from workloads.models.cross_encoder import CrossEncoder, autocast_dtype
from workloads.reranking import Reranking, rerank_and_evaluate
from workloads.spec import TrialSpec

STATE_FILE = "training_state.pt"
PROGRESS_FILE = "progress.json"
CROSS_ENCODER_PREFIX = "val_cross_encoder_"  # the cross-encoder alone, logged when interpolating
WEIGHT_METRIC = "val_interpolation_weight"  # the weight tuned on validation at that epoch


@dataclass(frozen=True)
class TrainingInputs:
    """Files a worker reads (on storage every worker sees) and the validation judgements."""

    training_set: str
    validation_candidates: str
    validation_first_stage_run: str
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int
    augmentation: str | None = None  # Parquet row-aligned with training_set, or None


# metrics, checkpoint directory (rank 0 only, else None)
Reporter = Callable[[dict[str, float], Path | None], None]


def validation_metrics(validation: Reranking) -> dict[str, float]:
    """``val_*`` of the final ranking; with interpolation also the cross-encoder alone and the weight."""
    metrics = {f"val_{k}": v for k, v in validation.evaluation.aggregate.items()}
    if validation.weight is not None:
        metrics.update({f"{CROSS_ENCODER_PREFIX}{k}": v for k, v in validation.cross_encoder.aggregate.items()})
        metrics[WEIGHT_METRIC] = validation.weight
    return metrics


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _log(rank: int, message: str) -> None:
    if rank == 0:
        print(f"[train] {message}", file=sys.stderr, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def train_cross_encoder(
    spec: TrialSpec,
    inputs: TrainingInputs,
    report: Reporter,
    device: torch.device | None = None,
    resume_from: Path | None = None,
) -> None:
    rank, world = _rank_and_world()
    device = device or torch.device("cpu")
    seed_everything(spec.seed)
    opt = spec.optimization

    model_source = str(resume_from) if resume_from else spec.model.name
    model = CrossEncoder.from_pretrained(model_source, spec.model.max_length, spec.model.pooling).to(device)
    wrapped: torch.nn.Module = model
    if world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = build_loss(spec.loss, model.encoder.config.hidden_size).to(device)

    rows = pq.read_table(inputs.training_set).to_pylist()
    if inputs.augmentation:
        augmentation = pq.read_table(inputs.augmentation).to_pylist()
        if [a["positive_id"] for a in augmentation] != [r["positive_id"] for r in rows]:
            raise ValueError(f"{inputs.augmentation} is not aligned with {inputs.training_set}")
        rows = [{**row, **extra} for row, extra in zip(rows, augmentation)]
    triples_per_batch = opt.batch_size // 2
    batches_per_epoch = len(rows) // triples_per_batch  # incomplete last batch dropped
    steps_per_rank = batches_per_epoch // world
    if steps_per_rank == 0:
        raise ValueError(f"{len(rows)} triples make no full batch of {triples_per_batch} triples per worker x {world} workers")
    total_steps = steps_per_rank * opt.epochs
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    named = [*model.named_parameters(), *loss_fn.named_parameters()]  # e.g. NCA's learned map
    groups = [
        {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": opt.weight_decay},
        {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=opt.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(opt.warmup_ratio * total_steps), total_steps)
    amp_dtype = autocast_dtype(device, opt.precision)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)

    first_epoch = 1
    if resume_from is not None and (Path(resume_from) / STATE_FILE).exists():
        state = torch.load(Path(resume_from) / STATE_FILE, map_location=device, weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        loss_fn.load_state_dict(state["loss"])
        first_epoch = state["epoch"] + 1
        _log(rank, f"resumed from {resume_from} after epoch {state['epoch']}")

    validation_run = read_trec_run(Path(inputs.validation_first_stage_run))
    _log(rank, f"{len(rows)} triples, {steps_per_rank} steps/epoch x {opt.epochs} epochs, {world} worker(s) on {device}, "
               f"precision {amp_dtype or torch.float32}")
    for epoch in range(first_epoch, opt.epochs + 1):
        wrapped.train()
        order = list(range(len(rows)))
        random.Random(spec.seed * 1_000 + epoch).shuffle(order)
        my_batches = [order[b * triples_per_batch:(b + 1) * triples_per_batch] for b in range(rank, steps_per_rank * world, world)]
        started = time.perf_counter()
        total_loss = 0.0
        parts = {"ranking": 0.0, "contrastive": 0.0}
        for step, batch_rows in enumerate(my_batches, 1):
            batch = triples_to_batch([rows[i] for i in batch_rows])
            pairs = model.encode(batch.queries, batch.documents).to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                scores, phi = wrapped(**pairs.inputs)
            loss = loss_fn(ModelOutputs(scores.float(), phi.float()), batch.structure.to(device))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            total_loss += float(loss.detach())
            if isinstance(loss_fn, RankingWithContrastive):
                for name, value in loss_fn.last_parts.items():
                    parts[name] += value
            if step % max(1, len(my_batches) // 10) == 0 or step == len(my_batches):
                rate = step * opt.batch_size / (time.perf_counter() - started)
                _log(rank, f"epoch {epoch} step {step}/{len(my_batches)} loss {total_loss / step:.4f} ({rate:.1f} pairs/s/worker)")
        train_seconds = time.perf_counter() - started

        metrics: dict[str, float] = {"epoch": epoch, "train_loss": total_loss / len(my_batches),
                                     "epoch_train_seconds": train_seconds,
                                     "degenerate_batches": float(loss_fn.degenerate_batches)}
        if isinstance(loss_fn, RankingWithContrastive):
            metrics.update({f"train_{name}_loss": value / len(my_batches) for name, value in parts.items()})
        checkpoint: Path | None = None
        if rank == 0:
            eval_started = time.perf_counter()
            validation = rerank_and_evaluate(
                model, Path(inputs.validation_candidates), validation_run, inputs.validation_qrels,
                inputs.relevance_level, opt.eval_batch_size, device, label=f"validate epoch {epoch}",
                interpolation=spec.reranking.interpolation,
            )
            metrics.update(validation_metrics(validation))
            metrics["epoch_validation_seconds"] = time.perf_counter() - eval_started
            checkpoint = Path(tempfile.mkdtemp(prefix=f"epoch-{epoch}-"))
            model.save(checkpoint)
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                        "scaler": scaler.state_dict(), "loss": loss_fn.state_dict(), "epoch": epoch},
                       checkpoint / STATE_FILE)
            (checkpoint / PROGRESS_FILE).write_text(json.dumps(metrics))
            fused = (f" (cross-encoder alone {metrics[CROSS_ENCODER_PREFIX + PRIMARY_METRIC]:.4f}, "
                     f"interpolation weight {validation.weight:.2f})" if validation.weight is not None else "")
            _log(rank, f"epoch {epoch}: train {train_seconds:.0f}s, validation {PRIMARY_METRIC} "
                       f"{metrics['val_' + PRIMARY_METRIC]:.4f}{fused}")
        report(metrics, checkpoint)
