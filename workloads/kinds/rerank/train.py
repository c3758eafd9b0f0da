"""The re-ranking kind's training: a cross-encoder trained with the registry's losses, in
:func:`workloads.training.loop.run_epochs` (the one epoch loop), once per data-parallel worker.

AdamW (fused where the device has the kernel) with linear warmup and decay, gradient
clipping, bf16/fp16 autocast, dynamic padding, validation after each epoch by re-ranking
the first-stage top-k; SIR's staged variants train one compressor per stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from transformers import get_linear_schedule_with_warmup

from workloads.core.logs import get_logger, progress_bar
from workloads.core.seeds import derived_seed
from workloads.evaluation import PRIMARY_METRIC
from workloads.evaluation.reranking import rerank_and_evaluate
from workloads.kinds.rerank.batching import make_batch, plan_epoch, row_negatives, rows_per_batch
from workloads.kinds.rerank.curriculum import CurriculumObjective
from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE, InEpochCheckpoints
from workloads.kinds.rerank.sir import compress_blocks, compressed_rows
from workloads.kinds.rerank.spec import TrialSpec
from workloads.losses import build_loss
from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, compile_encoder, score_pairs
from workloads.retrieval.bm25 import read_trec_run
from workloads.text.tokenized import TokenizedPairs
from workloads.training.epoch_metrics import CROSS_ENCODER_PREFIX, validation_metrics
from workloads.training.loop import (
    EarlyStopping,
    Reporter,
    agreed,
    rank_and_world,
    rank_generators,
    restore_generators,
    run_epochs,
    seed_everything,
)
from workloads.training.objective import TrainingObjective, load_loss_state
from workloads.training.step import RunningLoss, adamw, checked_step, data_parallel


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


NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


def parameter_groups(objective: TrainingObjective, weight_decay: float) -> list[dict]:
    """AdamW groups: the encoder's weights decay; biases, norms and the loss's own parameters
    do not (decay pulls towards 0, and a learned NCA map starts at, and should stay near,
    the identity)."""
    encoder = list(objective.model.named_parameters())
    return [
        {"params": [p for n, p in encoder if not n.endswith(NO_DECAY)], "weight_decay": weight_decay},
        {"params": [p for n, p in encoder if n.endswith(NO_DECAY)] + list(objective.loss_fn.parameters()), "weight_decay": 0.0},
    ]


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
    in a thread while the current step runs (from the stored ids of ``tokenized``, padded with
    numpy; pairs it lacks by the fast tokenizer, which releases the GIL), in pinned memory with a
    non-blocking copy on GPU, its structure (labels, ids) too, so the step never waits on input
    and no blocking copy waits for the GPU's queued work. Written here rather than with a torch
    DataLoader: one batch of lookahead needs no worker processes, and the rows (with their
    texts) are not pickled to them every epoch."""
    pin = device.type == "cuda"

    def prepare(plan):
        batch = make_batch(rows, plan, batching)
        pairs = model.encode(batch.queries, batch.documents, tokenized)
        if pin:
            batch.structure = batch.structure.pin_memory()
        return batch, pairs.pin_memory() if pin else pairs

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch") as pool:
        upcoming = pool.submit(prepare, planned[0]) if planned else None
        for index in range(len(planned)):
            batch, pairs = upcoming.result()
            if index + 1 < len(planned):
                upcoming = pool.submit(prepare, planned[index + 1])
            if pin:
                batch.structure = batch.structure.to(device, non_blocking=True)
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
    in_epoch_dir: Path | None = None,
) -> None:
    """Train ``spec`` and report every epoch (see :data:`Reporter`); ``resume_from`` is the
    last reported checkpoint of an interrupted attempt. ``stop_requested`` (asked by rank 0
    after every step) ends training early and cleanly: a sweep's pruner uses it, so the
    workers return and release their resources instead of being killed.

    With ``optimization.checkpoint_every``, and when a spot interruption is announced
    (:mod:`workloads.training.spot`), the state inside an epoch is saved in ``in_epoch_dir``
    (one directory, replaced each time, on storage every worker sees); a restarted attempt
    whose in-epoch state is newer than ``resume_from`` continues after its step (see
    :class:`InEpochCheckpoints`). Resumed from either, it draws what the uninterrupted trial
    would (every worker's generators are in both), so it ends with the same weights.

    SIR's staged variants (v1, v2) train ``len(levels) + 1`` compressors in sequence, each for
    ``optimization.epochs``; epochs are numbered across stages and each reports its ``stage``.
    At the end of a stage the compressor selects the next stage's negatives offline
    (``workloads.kinds.rerank.sir.compress_blocks``), before that epoch's checkpoint is written, so a
    trial killed in stage s resumes in stage s with the same blocks.
    """
    in_epoch = InEpochCheckpoints.of(spec, in_epoch_dir, device or torch.device("cpu"))
    hooks = RerankEpochs(spec, inputs, device or torch.device("cpu"), stop_requested, in_epoch)
    first_stage, first_epoch, state, kept, model_source = _stage_start(spec, resume_from, spec.optimization.epochs)
    saved = in_epoch.load(first_epoch, hooks.steps_per_rank) if in_epoch is not None else None
    if saved is not None:  # killed inside first_epoch after a saved step: its state replaces the epoch's start
        state, directory = saved
        first_stage, kept, model_source = state["stage"], state["kept"], str(directory)
        hooks.resume_at = state
        hooks.say(f"resumed inside epoch {first_epoch} after step {state['step']} from {directory}")
    elif resume_from is not None and first_epoch > 1:
        # the generators as the uninterrupted trial's next epoch finds them (none when a new SIR
        # stage starts: every stage starts from the seed)
        hooks.resume_generators = rank_generators(state, hooks.rank, hooks.world)
        hooks.say(f"resumed from {resume_from} after epoch {first_epoch - 1}"
                  + (f" (stage {first_stage} of {hooks.stages})" if hooks.stages > 1 else ""))
    stopping = hooks.stopping = EarlyStopping.restored(spec.optimization.early_stopping_patience, state)
    epochs, final_epoch = spec.optimization.epochs, hooks.stages * spec.optimization.epochs
    for stage in range(first_stage, hooks.stages + 1):
        if first_epoch > final_epoch:
            break  # resumed after the last (or an early-stopped) epoch
        hooks.start_stage(stage, kept, model_source, state)
        state = None
        if run_epochs(hooks, range(first_epoch, stage * epochs + 1), final_epoch, stopping, report, hooks.rank, hooks.world):
            break
        first_epoch, kept = stage * epochs + 1, hooks.next_kept
    if in_epoch is not None:
        in_epoch.close()
        if hooks.rank == 0:
            in_epoch.clear()  # every epoch it could resume is reported


class RerankEpochs:
    """The re-ranking kind's :class:`~workloads.training.loop.EpochHooks`: one SIR stage (or the
    whole trial) at a time, :meth:`start_stage` building its model, loss and optimizer."""

    label = ""
    state_file = STATE_FILE

    def __init__(self, spec: TrialSpec, inputs: TrainingInputs, device: torch.device,
                 stop_requested: Callable[[], bool] | None, in_epoch: InEpochCheckpoints | None = None) -> None:
        self.entered: float | None = time.perf_counter()
        self.spec, self.inputs, self.device, self.stop_requested = spec, inputs, device, stop_requested
        self.in_epoch = in_epoch
        self.resume_at: dict | None = None  # an in-epoch state to continue from (its epoch's first call)
        self.resume_generators: dict | None = None  # an epoch checkpoint's generators (its next epoch's first call)
        self.stopping = EarlyStopping(spec.optimization.early_stopping_patience)
        self.rank, self.world = rank_and_world()
        opt = self.opt = spec.optimization
        self.stages = spec.sir.stages if spec.sir is not None else 1
        self.triples = pq.read_table(inputs.training_set).to_pylist()
        negatives = spec.training_data.negatives
        batches_per_epoch = len(self.plan(self.triples, 1))  # incomplete last batch dropped
        # optimizer steps: a step takes `gradient_accumulation` batches
        self.steps_per_rank = batches_per_epoch // (self.world * opt.gradient_accumulation)
        if self.steps_per_rank == 0:
            raise ValueError(f"{len(self.triples)} training rows make no full step ({opt.batching}, "
                             f"{rows_per_batch(opt.batching, opt.batch_size, negatives)} rows per batch, "
                             f"{opt.gradient_accumulation} batch(es) per step) per worker x {self.world} workers")
        self.amp_dtype = autocast_dtype(device, opt.precision)
        self.validation_run = read_trec_run(Path(inputs.validation_first_stage_run))
        self.model: CrossEncoder | None = None
        self.tokenized: TokenizedPairs | None = None
        self.next_kept: list[list[int]] | None = None

    def say(self, message: str) -> None:
        if self.rank == 0:  # one worker speaks for the data-parallel group
            get_logger("train").info(message)

    def plan(self, rows: list[dict], epoch: int):
        opt = self.opt
        return plan_epoch(rows, opt.batching, opt.batch_size, self.spec.training_data.negatives, opt.cft_positives,
                          self.spec.seed, epoch, opt.length_bucketing)

    def start_stage(self, stage: int, kept: list[list[int]] | None, model_source: str, state: dict | None) -> None:
        spec, opt, sir, device = self.spec, self.opt, self.spec.sir, self.device
        self.stage, self.kept, self.next_kept = stage, kept, None
        seed_everything(spec.seed)  # every compressor starts from the same initialisation (v1: "the same checkpoint")
        if self.model is None or sir.variant == "v1":
            self.model = CrossEncoder.from_pretrained(model_source if self.model is None else spec.model.name,
                                                      spec.model.max_length, spec.model.pooling).to(device)
            if opt.gradient_checkpointing:
                _enable_gradient_checkpointing(self.model)
            if opt.compile:
                compile_encoder(self.model, **opt.compile_options)
        if self.tokenized is None:  # the training set's pairs, tokenized once for every trial and epoch that reads them
            self.tokenized = self.model.tokenized(*training_pairs(self.triples))
        self.loss_fn = build_loss(spec.loss, self.model.encoder.config.hidden_size).to(device)
        if sir is not None and sir.variant in ("v3", "v4"):
            self.objective: TrainingObjective = CurriculumObjective(self.model, self.loss_fn, self.amp_dtype, sir,
                                                                    spec.loss.ranking)
        else:
            self.objective = TrainingObjective(self.model, self.loss_fn, self.amp_dtype)
        self.wrapped = data_parallel(self.objective, self.world, device)
        total_steps = self.steps_per_rank * opt.epochs
        self.optimizer = adamw(parameter_groups(self.objective, opt.weight_decay), lr=opt.learning_rate)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, int(opt.warmup_ratio * total_steps), total_steps)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        if state is not None and "optimizer" in state:  # absent after the last epoch: nothing left to train
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            load_loss_state(self.loss_fn, state["loss"])
        self.stage_rows = compressed_rows(self.triples, kept)
        unit = ("triples" if opt.batching == "triples"
                else f"rows of 1 + up to {spec.training_data.negatives} ({opt.batching})")
        block = f", stage {stage}/{self.stages}: blocks of 1 + up to {sir.levels[stage - 2] - 1}" if stage > 1 else ""
        accumulated = f" of {opt.gradient_accumulation} accumulated batches" if opt.gradient_accumulation > 1 else ""
        self.say(f"{len(self.triples)} {unit}{block}, {self.steps_per_rank} steps/epoch{accumulated} x {opt.epochs} "
                 f"epochs, {self.world} worker(s) on {device}, precision {self.amp_dtype or torch.float32}")

    def _seed_curriculum(self, epoch: int, step: int) -> Callable[[int], None]:
        def seed(index: int) -> None:
            if isinstance(self.objective, CurriculumObjective):  # random selection: one generator per batch
                self.objective.generator = torch.Generator().manual_seed(
                    derived_seed("curriculum", self.spec.seed, epoch, step, index))
        return seed

    def _step(self, micro: list, epoch: int, step: int, parts: dict) -> torch.Tensor:
        advice = (f"a step of {len(micro[0][0].documents)} sequences of up to {self.spec.model.max_length} tokens does not "
                  f"fit on {self.device}: lower optimization.batch_size (pairs per batch; optimization.gradient_accumulation "
                  "keeps the step's size) or training_data.negatives (block size), set "
                  "optimization.gradient_checkpointing: true, set optimization.micro_batch_size (pairs per forward), "
                  "or lower model.max_length")
        return checked_step(advice, self.wrapped, self.objective, self.optimizer, self.scheduler, self.scaler,
                            [(pairs.inputs, batch.structure.to(self.device)) for batch, pairs in micro],
                            self.opt.max_grad_norm, self.opt.micro_batch_size, self._seed_curriculum(epoch, step), parts)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        opt, steps = self.opt, self.steps_per_rank
        accumulation = opt.gradient_accumulation
        rows = with_augmentation(self.stage_rows, self.inputs.augmentation_for(epoch), self.inputs.training_set)
        self.wrapped.train()
        my_batches = self.plan(rows, epoch)[self.rank:steps * accumulation * self.world:self.world]
        started = time.perf_counter()
        # the attempt's set-up (training set, model, tokenized pairs, optimizer), reported once
        setup = {"epoch_setup_seconds": started - self.entered} if self.entered is not None else {}
        self.entered = None
        total_loss, pairs_seen, done = 0.0, 0, 0
        parts: dict[str, float | torch.Tensor] = {}  # fp64 sums on the device; floats when resumed
        if self.resume_at is not None:  # continue after the saved step, as if never interrupted
            resumed, self.resume_at = self.resume_at, None
            done, total_loss, pairs_seen, parts = resumed["step"], resumed["total_loss"], resumed["pairs_seen"], resumed["parts"]
            restore_generators(resumed["generators"])
        elif self.resume_generators is not None:  # after the start of a stage (which seeds), as if never interrupted
            restore_generators(self.resume_generators)
        self.resume_generators = None
        # the epoch's loss sum stays on the device, read once per logging interval (and saved with
        # an in-epoch state): no step waits for the device to finish the one before
        running = RunningLoss(self.device, total_loss)
        logging_interval = max(1, steps // 10)
        batches = prefetched(self.model, rows, my_batches[done * accumulation:], opt.batching, self.device, self.tokenized)
        for step in range(done + 1, steps + 1):
            micro = [next(batches) for _ in range(accumulation)]
            pairs_seen += sum(len(batch.documents) for batch, _ in micro)  # lists may be short; augmentation doubles
            running.add(self._step(micro, epoch, step, parts))
            if self.stop_requested is not None and agreed(self.rank == 0 and self.stop_requested(), self.world):
                self.say(f"stopping in epoch {epoch}, step {step}: requested (pruned)")
                return None
            if self.in_epoch is not None and self.in_epoch.due(step, steps, self.rank, self.world):
                self.in_epoch.save(self.model, {**self.save_state(resumable=True), "epoch": epoch, "step": step,
                                                "world": self.world, "steps_per_rank": steps,
                                                "total_loss": running.value(), "pairs_seen": pairs_seen,
                                                "parts": {name: float(value) for name, value in parts.items()},
                                                **self.stopping.state()}, self.rank, self.world)
            if self.rank == 0 and (step % logging_interval == 0 or step == steps):
                rate = pairs_seen / (time.perf_counter() - started)
                self.say(f"epoch {epoch}/{self.stages * opt.epochs} {progress_bar(step, steps)} step {step}/"
                         f"{steps} loss {running.value() / step:.4f} ({rate:.1f} pairs/s/worker)")
        batches.close()
        metrics: dict[str, float] = {"epoch": epoch, "train_loss": running.value() / steps,
                                     "epoch_train_seconds": time.perf_counter() - started,
                                     "degenerate_batches": float(self.loss_fn.degenerate_batches), **setup}
        if self.stages > 1:
            metrics["stage"] = self.stage
        metrics.update({f"train_{name}_loss": float(value) / steps for name, value in parts.items()})
        if epoch == self.stage * opt.epochs and self.stage < self.stages:
            metrics["epoch_selection_seconds"] = self._select_next_stage()
        return metrics

    def _select_next_stage(self) -> float:
        selecting = time.perf_counter()
        keep = self.spec.sir.levels[self.stage - 1]
        self.next_kept = _select_for_next_stage(self.model, self.triples, self.kept, keep, self.spec.sir.selection,
                                                self.spec.seed, self.stage, self.opt, self.device, self.rank, self.world,
                                                self.tokenized)
        seconds = time.perf_counter() - selecting
        self.say(f"stage {self.stage}/{self.stages}: the compressor kept the positive and up to {keep - 1} "
                 f"negatives of each block for stage {self.stage + 1} ({seconds:.0f}s)")
        return seconds

    def validate(self, epoch: int) -> dict[str, float]:
        self.validation = rerank_and_evaluate(
            self.model, Path(self.inputs.validation_candidates), self.validation_run, self.inputs.validation_qrels,
            self.inputs.relevance_level, self.opt.eval_batch_size, self.device, label=f"validate epoch {epoch}",
            interpolation=self.spec.reranking.interpolation, precision=self.opt.precision,
        )
        return validation_metrics(self.validation)

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        self.model.save(checkpoint)
        return self.save_state(resumable)

    def save_state(self, resumable: bool) -> dict:
        state = {"stage": self.stage, "kept": self.kept, "next_kept": self.next_kept, "loss": self.loss_fn.state_dict()}
        if resumable:
            state |= {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                      "scaler": self.scaler.state_dict()}
        return state

    def describe(self, metrics: dict[str, float]) -> str:
        if self.validation.weight is None:
            return ""
        return (f" (cross-encoder alone {metrics[CROSS_ENCODER_PREFIX + PRIMARY_METRIC]:.4f}, "
                f"interpolation weight {self.validation.weight:.2f})")


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
