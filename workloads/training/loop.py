"""The one epoch loop every trial kind trains with, run once per data-parallel worker.

Framework-free on purpose: the orchestrator runs it inside Ray Train workers (which set up
``torch.distributed``), tests run it in-process. A kind supplies :class:`EpochHooks` (train
one epoch on every worker; validate and save on rank 0); the loop owns what is the same for
every kind: validation on rank 0 only, the checkpoint of every epoch with its resumable
state (every worker's random generators included, so a resumed trial draws the dropout
masks an uninterrupted one would), early stopping on the selection metric, and one report
per epoch through a :data:`Reporter`.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from workloads.core.logs import get_logger
from workloads.evaluation import PRIMARY_METRIC

PROGRESS_FILE = "progress.json"
SELECTION_METRIC = f"val_{PRIMARY_METRIC}"  # every epoch is chosen on validation nDCG@10, never on test

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


def rank_and_world() -> tuple[int, int]:
    """This worker's rank and the data-parallel group's size (0, 1 outside ``torch.distributed``)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def agreed(decision: bool, world: int) -> bool:
    """Rank 0's decision on every worker (only rank 0 validates)."""
    if world == 1:
        return decision
    flag = [decision]
    dist.broadcast_object_list(flag, src=0)
    return bool(flag[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def generator_state() -> dict:
    """This process's global random generators (Python's, torch's CPU one, the current CUDA
    device's once CUDA is in use): what draws dropout masks. numpy's global generator is not
    used in training (its draws are seeded per use)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_generators(state: dict) -> None:
    """Put back what :func:`generator_state` saved (loaded onto any device: torch wants CPU bytes)."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


def gathered_generators(world: int) -> list[dict]:
    """Every worker's :func:`generator_state`, in rank order (every worker calls it)."""
    if world == 1:
        return [generator_state()]
    states: list = [None] * world
    dist.all_gather_object(states, generator_state())
    return states


def rank_generators(state: dict | None, rank: int, world: int) -> dict | None:
    """This worker's generators in an epoch checkpoint's ``state``; None where it has none
    (written before checkpoints carried them) or was saved by another number of workers."""
    generators = (state or {}).get("generators")
    return generators[rank] if generators is not None and len(generators) == world else None


@dataclass
class EarlyStopping:
    """Epochs without a better validation value; ``patience`` None never stops."""

    patience: int | None
    best: float = float("-inf")
    stale: int = 0

    def update(self, value: float) -> None:
        self.best, self.stale = (value, 0) if value > self.best else (self.best, self.stale + 1)

    @property
    def exhausted(self) -> bool:
        return self.patience is not None and self.stale >= self.patience

    def state(self) -> dict:
        return {"best_value": self.best, "stale": self.stale}

    @classmethod
    def restored(cls, patience: int | None, state: dict | None) -> EarlyStopping:
        state = state or {}
        # "best": the selector's checkpoints before the loops were one
        return cls(patience, state.get("best_value", state.get("best", float("-inf"))), state.get("stale", 0))


class EpochHooks(Protocol):
    """What a trial kind does in each epoch of :func:`run_epochs`."""

    label: str       # names the kind in logs and temporary directories ("" for the re-ranker)
    state_file: str  # the resumable state's file in each checkpoint

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        """Every worker: train one epoch; its metrics (``epoch``, ``train_loss``, ...), or None
        when a stop was requested (a pruned trial)."""

    def validate(self, epoch: int) -> dict[str, float]:
        """Rank 0: the ``val_*`` metrics of the model as it is now."""

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        """Rank 0: write the model into ``checkpoint``; return the kind's state to resume from
        (optimizer and schedule only when ``resumable``: a trial's last epoch resumes nothing)."""

    def describe(self, metrics: dict[str, float]) -> str:
        """Rank 0: what the epoch's log line adds after the validation value."""


def run_epochs(hooks: EpochHooks, epochs: Iterable[int], final_epoch: int, stopping: EarlyStopping, report: Reporter,
               rank: int, world: int) -> bool:
    """Train, validate (rank 0), checkpoint and report each of ``epochs``; ``final_epoch`` is the
    trial's last. Returns True when training ended before ``final_epoch`` (stopped early, or a
    stop was requested)."""
    log = get_logger(hooks.label or "train")
    for epoch in epochs:
        metrics = hooks.train_epoch(epoch)
        if metrics is None:
            return True
        # every worker's generators as its next epoch finds them: an attempt resumed from this
        # checkpoint draws the dropout masks an uninterrupted one would (bit-identical on CPU)
        generators = gathered_generators(world)
        checkpoint, stop = None, False
        if rank == 0:
            validating = time.perf_counter()
            metrics.update(hooks.validate(epoch))
            metrics["epoch_validation_seconds"] = time.perf_counter() - validating
            generators[0] = generator_state()  # rank 0's next epoch starts after validation
            saving = time.perf_counter()
            checkpoint = Path(tempfile.mkdtemp(prefix=f"{hooks.label}{'-' if hooks.label else ''}epoch-{epoch}-"))
            stopping.update(metrics[SELECTION_METRIC])
            stop = stopping.exhausted and epoch < final_epoch
            state = {"epoch": epoch, **stopping.state(), "stopped": stop, "generators": generators,
                     **hooks.save(checkpoint, resumable=epoch < final_epoch and not stop)}
            torch.save(state, checkpoint / hooks.state_file)
            metrics["epoch_checkpoint_seconds"] = time.perf_counter() - saving
            (checkpoint / PROGRESS_FILE).write_text(json.dumps(metrics))
            log.info(f"{hooks.label + ' ' if hooks.label else ''}epoch {epoch}: train {metrics['epoch_train_seconds']:.0f}s, "
                     f"validation {PRIMARY_METRIC} {metrics[SELECTION_METRIC]:.4f}{hooks.describe(metrics)}")
        report_epoch(report, metrics, checkpoint)
        if stopping.patience is not None and agreed(rank == 0 and stop, world):
            if rank == 0:
                log.info(f"early stopping after epoch {epoch}: no better validation {PRIMARY_METRIC} for "
                         f"{stopping.patience} epoch(s) (best {stopping.best:.4f})")
            return True
    return False


__all__ = ["PROGRESS_FILE", "SELECTION_METRIC", "Reporter", "report_epoch", "rank_and_world", "agreed", "seed_everything",
           "generator_state", "restore_generators", "gathered_generators", "rank_generators", "EarlyStopping", "EpochHooks",
           "run_epochs"]
