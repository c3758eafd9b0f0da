"""The cross-encoder training loop, run once per data-parallel worker.

Framework-free on purpose: the orchestrator runs it inside Ray Train workers (which set up
``torch.distributed``), tests run it in-process. It reports one record per epoch through a
callback, with the epoch's checkpoint directory (on rank 0) so the caller can persist it.

AdamW (fused where the device has the kernel) with linear warmup and decay, gradient
clipping, bf16/fp16 autocast on GPU, dynamic padding, validation after each epoch by
re-ranking the first-stage top-k.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

from workloads.batches import PairStructure
from workloads.batching import make_batch, plan_epoch, row_negatives, rows_per_batch
from workloads.evaluation import PRIMARY_METRIC
from workloads.logs import get_logger, progress_bar
from workloads.losses import ModelOutputs, PairLoss, build_loss
from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, compile_encoder, score_pairs
from workloads.reranking import Reranking, rerank_and_evaluate
from workloads.retrieval.bm25 import read_trec_run
from workloads.seeds import derived_seed
from workloads.sir import compress_blocks, compressed_rows, curriculum_loss
from workloads.spec import TrialSpec
from workloads.tokenized import TokenizedPairs

STATE_FILE = "training_state.pt"
PROGRESS_FILE = "progress.json"

# What the loop reports per epoch: "epoch", "degenerate_batches" ("stage" with SIR v1/v2), and names with these
# prefixes: val_* (the validation ranking; val_cross_encoder_* the cross-encoder alone and
# val_interpolation_weight the tuned weight when interpolating), train_* (losses) and
# epoch_* (seconds).
EPOCH_METRICS = ("epoch", "stage", "degenerate_batches")  # stage: SIR v1/v2 only
EPOCH_METRIC_PREFIXES = ("val_", "train_", "epoch_")
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
    # Parquet files row-aligned with training_set: one per epoch (redraw: epoch), or one for
    # every epoch (redraw: once); empty without augmentation.
    augmentations: tuple[str, ...] = ()

    def augmentation_for(self, epoch: int) -> str | None:
        if not self.augmentations:
            return None
        return self.augmentations[min(epoch, len(self.augmentations)) - 1]


# metrics, checkpoint directory (rank 0 only, else None). The directory is temporary: the
# loop removes it when the call returns, so a reporter copies or moves what it keeps (Ray
# Train's report persists it under the run's storage).
Reporter = Callable[[dict[str, float], Path | None], None]


def report_epoch(report: Reporter, metrics: dict[str, float], checkpoint: Path | None) -> None:
    """``report`` an epoch, then remove its temporary checkpoint directory (see :data:`Reporter`),
    also when the reporter raises: every epoch's directory would otherwise stay in the system's
    temporary directory (hundreds of MB each for MiniLM with its optimizer state)."""
    try:
        report(metrics, checkpoint)
    finally:
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)


def validation_metrics(validation: Reranking) -> dict[str, float]:
    """``val_*`` of the final ranking; with interpolation also the cross-encoder alone and the weight."""
    metrics = {f"val_{k}": v for k, v in validation.evaluation.aggregate.items()}
    if validation.weight is not None:
        metrics.update({f"{CROSS_ENCODER_PREFIX}{k}": v for k, v in validation.cross_encoder.aggregate.items()})
        metrics[WEIGHT_METRIC] = validation.weight
    return metrics


def with_augmentation(triples: list[dict], augmentation: str | None, training_set: str) -> list[dict]:
    """The training rows of one epoch: each triple with its augmentation columns, if any.

    Rows whose augmentation kept no sentence carry ``augmented_positive = None`` and gain
    no augmented pairs (``triples_to_batch``): an empty text is never trained as relevant.
    """
    if augmentation is None:
        return triples
    extra = pq.read_table(augmentation).to_pylist()
    if [a["positive_id"] for a in extra] != [r["positive_id"] for r in triples]:
        raise ValueError(f"{augmentation} is not aligned with {training_set}")
    return [{**row, **more} for row, more in zip(triples, extra)]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _log(rank: int, message: str) -> None:
    if rank == 0:  # one worker speaks for the data-parallel group
        get_logger("train").info(message)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class TrainingObjective(torch.nn.Module):
    """The cross-encoder and its loss as one module: what data-parallel training wraps.

    A loss can have parameters of its own (RankingNCA's learned map). Wrapping both in one
    module puts them under DDP, so every worker's copy gets the same averaged gradients and
    stays the same; wrapping the encoder alone let the copies of the map diverge.

    Every forward of the encoder goes through :meth:`pairs`, so a micro-batched step
    (:class:`MicroBatchedPairs`) can stand in for it.
    """

    def __init__(self, model: CrossEncoder, loss_fn: PairLoss, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.loss_fn, self.amp_dtype = model, loss_fn, amp_dtype
        self.replay: MicroBatchedPairs | None = None  # set for the first pass of a micro-batched step

    def encode_pairs(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores and phi (fp32) of tokenized pairs, under the objective's autocast."""
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            scores, phi = self.model(**inputs)
        return scores.float(), phi.float()

    def pairs(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.replay(inputs) if self.replay is not None else self.encode_pairs(inputs)

    def forward(self, inputs: dict[str, torch.Tensor], structure: PairStructure) -> torch.Tensor:
        scores, phi = self.pairs(inputs)
        return self.loss_fn(ModelOutputs(scores, phi), structure)


class CurriculumObjective(TrainingObjective):
    """SIR's levels in one forward of the objective (``workloads.sir``): level 1 scores every
    pair of the batch's blocks, each later level re-scores its survivors. One objective
    forward per step keeps data-parallel training to one forward per backward."""

    def __init__(self, model: CrossEncoder, loss_fn: PairLoss, amp_dtype: torch.dtype | None, sir, ranking: str) -> None:
        super().__init__(model, loss_fn, amp_dtype)
        self.sir, self.ranking = sir, ranking
        self.generator: torch.Generator | None = None  # set per step by the loop (random selection)

    def forward(self, inputs: dict[str, torch.Tensor], structure: PairStructure) -> torch.Tensor:
        def score(index: torch.Tensor) -> torch.Tensor:
            return self.pairs({k: v[index] for k, v in inputs.items()})[0]

        first = self.pairs(inputs)[0]
        return curriculum_loss(score, first, structure, self.sir, self.ranking, self.generator)


def _rng_state(device: torch.device):
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class MicroBatchedPairs:
    """A step's encoder forwards in micro-batches, with the whole step's gradient (GradCache:
    Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited
    Setup"). Written here because the losses need every score of a block at once (a softmax
    over 1 + N), which plain gradient accumulation cannot give.

    First pass: every forward the objective asks for runs without gradients, micro-batch by
    micro-batch, and returns leaf tensors; the loss is built on them and backpropagated to
    them (and to the loss's own parameters). Second pass (:meth:`backward`): each micro-batch
    is encoded again with gradients, under the RNG state of its first pass (the same dropout
    masks), and receives its slice of the leaves' gradient. Memory is one micro-batch's
    activations; the cost is about one more forward.
    """

    def __init__(self, objective: TrainingObjective, size: int) -> None:
        self.objective, self.size = objective, size
        self.device = next(objective.model.parameters()).device
        self.recorded: list[tuple[dict[str, torch.Tensor], list, torch.Tensor, torch.Tensor]] = []

    def _chunks(self, inputs: dict[str, torch.Tensor]):
        n = next(iter(inputs.values())).shape[0]
        for start in range(0, n, self.size):
            yield start, {k: v[start:start + self.size] for k, v in inputs.items()}

    def __call__(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        states, scores, phis = [], [], []
        with torch.no_grad():
            for _, chunk in self._chunks(inputs):
                states.append(_rng_state(self.device))
                s, p = self.objective.encode_pairs(chunk)
                scores.append(s)
                phis.append(p)
        leaves = torch.cat(scores).requires_grad_(), torch.cat(phis).requires_grad_()
        self.recorded.append((inputs, states, *leaves))
        return leaves

    def backward(self) -> None:
        after = _rng_state(self.device)
        for inputs, states, scores, phi in self.recorded:
            for (start, chunk), state in zip(self._chunks(inputs), states):
                _set_rng_state(self.device, state)
                s, p = self.objective.encode_pairs(chunk)
                outputs, grads = [], []
                for value, leaf in ((s, scores), (p, phi)):
                    if leaf.grad is not None:
                        outputs.append(value)
                        grads.append(leaf.grad[start:start + len(value)])
                if outputs:
                    torch.autograd.backward(outputs, grads)
        _set_rng_state(self.device, after)


class StepOutOfMemoryError(MemoryError):
    """A training step that does not fit, with the settings that make it smaller (a sweep
    records it as ``failure=oom`` and does not retry it)."""


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)


NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


_FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})


def adamw(groups: list[dict], **options) -> torch.optim.AdamW:
    """AdamW, fused (one kernel per step) where every parameter lives on a device that has
    the fused kernel: a step over MiniLM's 22.6M parameters takes 21 ms fused against 100 ms
    multi-tensor on 2 CPU cores (``benchmarks/fused_adamw.py``), a tenth of a short-pair
    training step. The same update (``test_fused_adamw_is_the_same_update``), and what
    transformers' Trainer, so sentence-transformers, uses by default with torch >= 2.8."""
    params = [p for group in groups for p in group["params"]]
    fused = bool(params) and all(p.device.type in _FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, fused=fused or None, **options)


def parameter_groups(objective: TrainingObjective, weight_decay: float) -> list[dict]:
    """AdamW groups: the encoder's weights decay; biases, norms and the loss's own parameters
    do not (decay pulls towards 0, and a learned NCA map starts at, and should stay near,
    the identity)."""
    encoder = list(objective.model.named_parameters())
    return [
        {"params": [p for n, p in encoder if not n.endswith(NO_DECAY)], "weight_decay": weight_decay},
        {"params": [p for n, p in encoder if n.endswith(NO_DECAY)] + list(objective.loss_fn.parameters()), "weight_decay": 0.0},
    ]


def optimization_step(wrapped: torch.nn.Module, objective: TrainingObjective, optimizer: torch.optim.Optimizer,
                      scheduler, scaler: torch.amp.GradScaler, inputs: dict[str, torch.Tensor], structure: PairStructure,
                      max_grad_norm: float, micro_batch_size: int | None = None) -> torch.Tensor:
    """One step on one batch (:func:`accumulated_step` with a single micro-step)."""
    return accumulated_step(wrapped, objective, optimizer, scheduler, scaler, [(inputs, structure)], max_grad_norm,
                            micro_batch_size)


def accumulated_step(wrapped: torch.nn.Module, objective: TrainingObjective, optimizer: torch.optim.Optimizer,
                     scheduler, scaler: torch.amp.GradScaler, micro_steps: list[tuple[dict[str, torch.Tensor], PairStructure]],
                     max_grad_norm: float, micro_batch_size: int | None = None,
                     before_each: Callable[[int], None] | None = None, parts: dict[str, float] | None = None) -> torch.Tensor:
    """One optimizer step over ``micro_steps`` batches (gradient accumulation): each batch's loss,
    divided by their number, through ``wrapped`` (the objective, or its DDP wrapper), backward;
    then clip every trainable parameter's gradient (the loss's own too), step, schedule.
    Returns the mean of the batches' losses. Where each loss is a mean over its batch, k
    accumulated batches of b pairs make the update of one batch of k * b pairs.

    Under DDP the gradients are averaged across workers once per step: every micro-step but the
    last runs in ``no_sync``. With ``micro_batch_size`` the encoder runs in micro-batches
    (:class:`MicroBatchedPairs`) outside DDP's forward, so the gradients are averaged across
    workers here, after the last batch. ``before_each(i)`` runs before batch i (per-batch seeding);
    ``parts`` accumulates the step's mean of each named part of the loss (``loss_fn.last_parts``)."""
    optimizer.zero_grad(set_to_none=True)
    count = len(micro_steps)
    total = torch.zeros(())
    _, world = _rank_and_world()
    for index, (inputs, structure) in enumerate(micro_steps):
        if before_each is not None:
            before_each(index)
        if micro_batch_size is None:
            last = index == count - 1
            sync = contextlib.nullcontext() if last or not hasattr(wrapped, "no_sync") else wrapped.no_sync()
            with sync:
                loss = wrapped(inputs, structure)
                scaler.scale(loss / count).backward()
        else:
            replay = objective.replay = MicroBatchedPairs(objective, micro_batch_size)
            try:
                loss = objective(inputs, structure)
                scaler.scale(loss / count).backward()
                replay.backward()
            finally:
                objective.replay = None
        total = total + loss.detach().cpu() / count
        if parts is not None:
            for name, value in objective.loss_fn.last_parts.items():
                parts[name] = parts.get(name, 0.0) + value / count
    if micro_batch_size is not None and world > 1:
        for parameter in objective.parameters():
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(objective.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    return total


def load_loss_state(loss_fn: PairLoss, state: dict) -> None:
    """Restore a loss's parameters and counters; checkpoints written before the counters were
    part of the state (no ``_extra_state``) restore the parameters and start the counters at 0."""
    missing, unexpected = loss_fn.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise ValueError(f"loss state does not match the loss: missing {missing}, unexpected {unexpected}")


def training_pairs(rows: list[dict]) -> tuple[list[str], list[str]]:
    """(queries, documents) of every (q, d+) and (q, d-) of the training rows: what the
    training set's stored token ids hold (augmented pairs are drawn per epoch, not stored)."""
    queries, documents = [], []
    for row in rows:
        for document in [row["positive"], *(text for _, text in row_negatives(row))]:
            queries.append(row["query"])
            documents.append(document)
    return queries, documents


def prefetched(model: CrossEncoder, rows: list[dict], planned: list, batching: str, device: torch.device,
               tokenized: TokenizedPairs | None = None):
    """(batch, tokenized pairs on ``device``) for each planned batch, the next one assembled
    in a thread while the current step runs (from the stored ids of ``tokenized``; pairs it
    lacks by the fast tokenizer, which releases the GIL), in pinned memory with a non-blocking
    copy on GPU, so the step never waits on input. Written here rather than with a torch
    DataLoader: one batch of lookahead needs no worker processes, and the rows (with their
    texts) are not pickled to them every epoch."""
    pin = device.type == "cuda"

    def prepare(plan):
        batch = make_batch(rows, plan, batching)
        pairs = model.encode(batch.queries, batch.documents, tokenized)
        return batch, pairs.pin_memory() if pin else pairs

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        upcoming = pool.submit(prepare, planned[0]) if planned else None
        for index in range(len(planned)):
            batch, pairs = upcoming.result()
            if index + 1 < len(planned):
                upcoming = pool.submit(prepare, planned[index + 1])
            yield batch, pairs.to(device, non_blocking=pin)


def _enable_gradient_checkpointing(model: CrossEncoder) -> None:
    # transformers 5 renamed it; the old name warns
    enable = getattr(model.encoder, "activation_checkpointing_enable", model.encoder.gradient_checkpointing_enable)
    enable()


def _stage_start(spec: TrialSpec, resume_from: Path | None, epochs_per_stage: int) -> tuple[int, int, dict | None, list | None, str]:
    """Where a (resumed) trial starts: (stage, first epoch, state to restore or None, the
    stage's kept negatives or None, model source). A checkpoint written at the end of a SIR
    stage starts the next stage: fresh optimizer, the negatives its compressor selected, the
    pretrained weights (v1) or the checkpoint's (v2)."""
    if resume_from is None or not (Path(resume_from) / STATE_FILE).exists():
        return 1, 1, None, None, str(resume_from) if resume_from else spec.model.name
    state = torch.load(Path(resume_from) / STATE_FILE, map_location="cpu", weights_only=False)
    done, stage = state["epoch"], state.get("stage", 1)
    if state.get("stopped"):  # stopped early: nothing is left to train
        return stage, spec.optimization.epochs * (spec.sir.stages if spec.sir else 1) + 1, state, state.get("kept"), str(resume_from)
    if state.get("next_kept") is not None and done == stage * epochs_per_stage:
        source = spec.model.name if spec.sir.variant == "v1" else str(resume_from)
        return stage + 1, done + 1, None, state["next_kept"], source
    return stage, done + 1, state, state.get("kept"), str(resume_from)


def train_cross_encoder(
    spec: TrialSpec,
    inputs: TrainingInputs,
    report: Reporter,
    device: torch.device | None = None,
    resume_from: Path | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> None:
    """Train ``spec`` and report every epoch (see :data:`Reporter`); ``resume_from`` is the
    last reported checkpoint of an interrupted attempt. ``stop_requested`` (asked by rank 0
    after every step) ends training early and cleanly: a sweep's pruner uses it, so the
    workers return and release their resources instead of being killed.

    SIR's staged variants (v1, v2) train ``len(levels) + 1`` compressors in sequence, each for
    ``optimization.epochs``; epochs are numbered across stages and each reports its ``stage``.
    At the end of a stage the compressor selects the next stage's negatives offline
    (``workloads.sir.compress_blocks``), before that epoch's checkpoint is written, so a
    trial killed in stage s resumes in stage s with the same blocks.
    """
    entered = time.perf_counter()
    rank, world = _rank_and_world()
    device = device or torch.device("cpu")
    opt = spec.optimization
    sir = spec.sir
    stages = sir.stages if sir is not None else 1
    epochs = opt.epochs  # per stage

    triples = pq.read_table(inputs.training_set).to_pylist()
    negatives = spec.training_data.negatives

    def plan(rows: list[dict], epoch: int):
        return plan_epoch(rows, opt.batching, opt.batch_size, negatives, opt.cft_positives, spec.seed, epoch,
                          opt.length_bucketing)

    batches_per_epoch = len(plan(triples, 1))  # incomplete last batch dropped
    accumulation = opt.gradient_accumulation
    steps_per_rank = batches_per_epoch // (world * accumulation)  # optimizer steps: a step takes `accumulation` batches
    if steps_per_rank == 0:
        raise ValueError(f"{len(triples)} training rows make no full step ({opt.batching}, "
                         f"{rows_per_batch(opt.batching, opt.batch_size, negatives)} rows per batch, {accumulation} "
                         f"batch(es) per step) per worker x {world} workers")
    total_steps = steps_per_rank * epochs
    amp_dtype = autocast_dtype(device, opt.precision)
    validation_run = read_trec_run(Path(inputs.validation_first_stage_run))
    unit = "triples" if opt.batching == "triples" else f"rows of 1 + up to {negatives} ({opt.batching})"

    first_stage, first_epoch, state, kept, model_source = _stage_start(spec, resume_from, epochs)
    if resume_from is not None and first_epoch > 1:
        _log(rank, f"resumed from {resume_from} after epoch {first_epoch - 1}"
                   + (f" (stage {first_stage} of {stages})" if stages > 1 else ""))
    patience = opt.early_stopping_patience
    best_value, stale = ((state or {}).get("best_value", float("-inf")), (state or {}).get("stale", 0))
    model: CrossEncoder | None = None
    tokenized: TokenizedPairs | None = None
    for stage in range(first_stage, stages + 1):
        if first_epoch > stages * epochs:
            break  # resumed after the last (or an early-stopped) epoch
        seed_everything(spec.seed)  # every compressor starts from the same initialisation (v1: "the same checkpoint")
        if model is None or sir.variant == "v1":
            model = CrossEncoder.from_pretrained(model_source if model is None else spec.model.name,
                                                 spec.model.max_length, spec.model.pooling).to(device)
            if opt.gradient_checkpointing:
                _enable_gradient_checkpointing(model)
            if opt.compile:
                compile_encoder(model)
        if tokenized is None:  # the training set's pairs, tokenized once for every trial and epoch that reads them
            tokenized = model.tokenized(*training_pairs(triples))
        loss_fn = build_loss(spec.loss, model.encoder.config.hidden_size).to(device)
        if sir is not None and sir.variant in ("v3", "v4"):
            objective: TrainingObjective = CurriculumObjective(model, loss_fn, amp_dtype, sir, spec.loss.ranking)
        else:
            objective = TrainingObjective(model, loss_fn, amp_dtype)
        wrapped: torch.nn.Module = objective
        if world > 1:
            wrapped = torch.nn.parallel.DistributedDataParallel(objective, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = adamw(parameter_groups(objective, opt.weight_decay), lr=opt.learning_rate)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(opt.warmup_ratio * total_steps), total_steps)
        scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
        if state is not None and "optimizer" in state:  # absent after the last epoch: nothing left to train
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            load_loss_state(loss_fn, state["loss"])
            state = None
        stage_rows = compressed_rows(triples, kept)
        block = f", stage {stage}/{stages}: blocks of 1 + up to {sir.levels[stage - 2] - 1}" if stage > 1 else ""
        accumulated = f" of {accumulation} accumulated batches" if accumulation > 1 else ""
        _log(rank, f"{len(triples)} {unit}{block}, {steps_per_rank} steps/epoch{accumulated} x {epochs} epochs, {world} "
                   f"worker(s) on {device}, precision {amp_dtype or torch.float32}")
        last_epoch = stage * epochs
        for epoch in range(first_epoch, last_epoch + 1):
            rows = with_augmentation(stage_rows, inputs.augmentation_for(epoch), inputs.training_set)
            wrapped.train()
            my_batches = plan(rows, epoch)[rank:steps_per_rank * accumulation * world:world]
            started = time.perf_counter()
            # the attempt's set-up (training set, model, tokenized pairs, optimizer), reported once
            setup = {"epoch_setup_seconds": started - entered} if entered is not None else {}
            entered = None
            total_loss, pairs_seen = 0.0, 0
            parts: dict[str, float] = {}
            batches = prefetched(model, rows, my_batches, opt.batching, device, tokenized)
            for step in range(1, steps_per_rank + 1):
                micro = [next(batches) for _ in range(accumulation)]
                pairs_seen += sum(len(batch.documents) for batch, _ in micro)  # lists may be short; augmentation doubles

                def seed_curriculum(index: int, epoch=epoch, step=step, objective=objective) -> None:
                    if isinstance(objective, CurriculumObjective):  # random selection: one generator per batch
                        objective.generator = torch.Generator().manual_seed(derived_seed("curriculum", spec.seed, epoch,
                                                                                         step, index))
                try:
                    loss = accumulated_step(wrapped, objective, optimizer, scheduler, scaler,
                                            [(pairs.inputs, batch.structure.to(device)) for batch, pairs in micro],
                                            opt.max_grad_norm, opt.micro_batch_size, seed_curriculum, parts)
                except (torch.OutOfMemoryError, RuntimeError) as exc:
                    if not _out_of_memory(exc):
                        raise
                    raise StepOutOfMemoryError(
                        f"a step of {len(micro[0][0].documents)} sequences of up to {spec.model.max_length} tokens does not "
                        f"fit on {device}: lower optimization.batch_size (pairs per batch; optimization.gradient_accumulation "
                        "keeps the step's size) or training_data.negatives (block size), set "
                        "optimization.gradient_checkpointing: true, set optimization.micro_batch_size (pairs per forward), "
                        "or lower model.max_length") from exc
                total_loss += float(loss)
                if stop_requested is not None and _agreed(rank == 0 and stop_requested(), world):
                    _log(rank, f"stopping in epoch {epoch}, step {step}: requested (pruned)")
                    return
                if step % max(1, steps_per_rank // 10) == 0 or step == steps_per_rank:
                    rate = pairs_seen / (time.perf_counter() - started)
                    _log(rank, f"epoch {epoch}/{stages * epochs} {progress_bar(step, steps_per_rank)} step {step}/"
                               f"{steps_per_rank} loss {total_loss / step:.4f} ({rate:.1f} pairs/s/worker)")
            batches.close()
            train_seconds = time.perf_counter() - started

            metrics: dict[str, float] = {"epoch": epoch, "train_loss": total_loss / steps_per_rank,
                                         "epoch_train_seconds": train_seconds,
                                         "degenerate_batches": float(loss_fn.degenerate_batches), **setup}
            if stages > 1:
                metrics["stage"] = stage
            metrics.update({f"train_{name}_loss": value / steps_per_rank for name, value in parts.items()})
            next_kept = None
            if epoch == last_epoch and stage < stages:
                selecting = time.perf_counter()
                next_kept = _select_for_next_stage(model, triples, kept, sir.levels[stage - 1], sir.selection,
                                                   spec.seed, stage, opt, device, rank, world, tokenized)
                metrics["epoch_selection_seconds"] = time.perf_counter() - selecting
                _log(rank, f"stage {stage}/{stages}: the compressor kept the positive and up to {sir.levels[stage - 1] - 1} "
                           f"negatives of each block for stage {stage + 1} ({metrics['epoch_selection_seconds']:.0f}s)")
            checkpoint: Path | None = None
            if rank == 0:
                eval_started = time.perf_counter()
                validation = rerank_and_evaluate(
                    model, Path(inputs.validation_candidates), validation_run, inputs.validation_qrels,
                    inputs.relevance_level, opt.eval_batch_size, device, label=f"validate epoch {epoch}",
                    interpolation=spec.reranking.interpolation, precision=opt.precision,
                )
                metrics.update(validation_metrics(validation))
                metrics["epoch_validation_seconds"] = time.perf_counter() - eval_started
                saving = time.perf_counter()
                checkpoint = Path(tempfile.mkdtemp(prefix=f"epoch-{epoch}-"))
                model.save(checkpoint)
                value = metrics["val_" + PRIMARY_METRIC]
                best_value, stale = (value, 0) if value > best_value else (best_value, stale + 1)
                stop = patience is not None and stale >= patience and epoch < stages * epochs
                state_out = {"epoch": epoch, "stage": stage, "kept": kept, "next_kept": next_kept,
                             "loss": loss_fn.state_dict(), "best_value": best_value, "stale": stale, "stopped": stop}
                if epoch < stages * epochs and not stop:  # a trial's last epoch resumes nothing: no optimizer state
                    state_out |= {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                  "scaler": scaler.state_dict()}
                torch.save(state_out, checkpoint / STATE_FILE)
                metrics["epoch_checkpoint_seconds"] = time.perf_counter() - saving
                (checkpoint / PROGRESS_FILE).write_text(json.dumps(metrics))
                fused = (f" (cross-encoder alone {metrics[CROSS_ENCODER_PREFIX + PRIMARY_METRIC]:.4f}, "
                         f"interpolation weight {validation.weight:.2f})" if validation.weight is not None else "")
                _log(rank, f"epoch {epoch}: train {train_seconds:.0f}s, validation {PRIMARY_METRIC} "
                           f"{metrics['val_' + PRIMARY_METRIC]:.4f}{fused}")
            report_epoch(report, metrics, checkpoint)
            if patience is not None and _agreed(rank == 0 and stop, world):
                _log(rank, f"early stopping after epoch {epoch}: no better validation {PRIMARY_METRIC} for {patience} "
                           f"epoch(s) (best {best_value:.4f})")
                return
        first_epoch, kept = last_epoch + 1, next_kept


def _agreed(decision: bool, world: int) -> bool:
    """Rank 0's decision on every worker (only rank 0 validates)."""
    if world == 1:
        return decision
    flag = [decision]
    dist.broadcast_object_list(flag, src=0)
    return bool(flag[0])


def _select_for_next_stage(model: CrossEncoder, rows: list[dict], kept: list[list[int]] | None, keep: int,
                           selection: str, seed: int, stage: int, opt, device: torch.device, rank: int,
                           world: int, tokenized: TokenizedPairs | None = None) -> list[list[int]]:
    """The next stage's negatives, chosen by this stage's compressor in eval mode over the
    whole training set (each worker scores its share; every worker gets the whole answer)."""
    current = kept if kept is not None else [list(range(len(row_negatives(row)))) for row in rows]
    numbers = list(range(rank, len(rows), world))

    def score(queries: list[str], documents: list[str]) -> list[float]:
        return score_pairs(model, queries, documents, opt.eval_batch_size, device, precision=opt.precision,
                           tokenized=tokenized)

    mine = compress_blocks(score, [rows[i] for i in numbers], [current[i] for i in numbers], keep, selection,
                           seed, stage, numbers)
    if world == 1:
        return mine
    shares: list = [None] * world
    dist.all_gather_object(shares, (numbers, mine))
    selected: list[list[int]] = [[] for _ in rows]
    for share_numbers, share in shares:
        for number, survivors in zip(share_numbers, share):
            selected[number] = survivors
    return selected
