"""The re-ranking kind's training state inside an epoch (:class:`InEpochCheckpoints`), and the
name of the state file a checkpoint carries beside the model."""

from __future__ import annotations

import shutil
import time
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

from workloads.core.logs import get_logger
from workloads.core.paths import injected_full_disk
from workloads.kinds.rerank.spec import TrialSpec
from workloads.models.cross_encoder import CrossEncoder
from workloads.training.loop import agreed, generator_state, rank_and_world
from workloads.training.spot import SpotNotice

STATE_FILE = "training_state.pt"


class InEpochCheckpoints:
    """The training state inside an epoch, saved every ``checkpoint_every`` steps or minutes.

    Ray Train's checkpoints are per epoch (each is scored by validation, which an epoch's
    middle has not); this one directory, replaced atomically each time, holds the model, the
    optimizer, schedule, scaler and loss state, each worker's random number generators and the
    data position (epoch, step: the epoch's batch plan is a function of the seed and the epoch).
    A resumed attempt skips the steps already taken, so it ends with the weights an
    uninterrupted one has (on CPU, bit for bit).

    A spot interruption notice (:class:`~workloads.training.spot.SpotNotice`, polled on GPU
    workers) asks for one save after the step in flight, with or without ``checkpoint_every``.
    """

    def __init__(self, directory: Path, every_steps: int | None, every_minutes: float | None,
                 notice: SpotNotice | None = None, polling: bool = False) -> None:
        self.directory = Path(directory)
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.last_saved = time.perf_counter()
        # polling: some worker has a notice poller, so every worker joins the per-step question
        self.notice, self.polling = notice, polling or notice is not None
        if notice is not None:
            weakref.finalize(self, notice.stop)  # also when training raises

    @classmethod
    def of(cls, spec: TrialSpec, directory: Path | None, device: torch.device | None = None) -> InEpochCheckpoints | None:
        """None without a directory; else saves every ``checkpoint_every`` (if set) and on a
        spot notice (a poller on ``device``'s worker, see :meth:`SpotNotice.for_worker`)."""
        if directory is None:
            return None
        every = spec.optimization.checkpoint_every
        notice = SpotNotice.for_worker(device) if device is not None else None
        polling = _any_rank(notice is not None, rank_and_world()[1])
        return cls(Path(directory), every and every.steps, every and every.minutes, notice, polling)

    def due(self, step: int, steps: int, rank: int, world: int) -> bool:
        """After ``step`` of ``steps``: save now? Never after the last step (the epoch's own
        checkpoint follows); by time, rank 0's clock decides for every worker; a spot notice
        on any worker's node decides for all."""
        if step >= steps:
            return False
        if self.polling and _any_rank(self.notice is not None and self.notice.pending(), world):
            return True
        if self.every_steps is not None:
            return step % self.every_steps == 0
        if self.every_minutes is None:
            return False
        return agreed(rank == 0 and time.perf_counter() - self.last_saved >= 60 * self.every_minutes, world)

    @property
    def _writing(self) -> Path:
        return self.directory.with_name(self.directory.name + ".writing")

    @property
    def _previous(self) -> Path:
        return self.directory.with_name(self.directory.name + ".previous")

    def save(self, model: CrossEncoder, state: dict, rank: int, world: int) -> None:
        """Every worker: its generators; rank 0: the model and ``state``. The new directory
        replaces the old one only once complete (a kill while writing keeps the last one)."""
        if rank == 0:
            shutil.rmtree(self._writing, ignore_errors=True)
            self._writing.mkdir(parents=True)
        _barrier(world)
        torch.save(generator_state(), self._writing / f"generators-{rank}.pt")
        if rank == 0:
            model.save(self._writing)
            torch.save(state, self._writing / STATE_FILE)
            injected_full_disk(self.directory)
        _barrier(world)
        if rank == 0:
            shutil.rmtree(self._previous, ignore_errors=True)
            if self.directory.exists():
                self.directory.rename(self._previous)
            self._writing.rename(self.directory)
            shutil.rmtree(self._previous, ignore_errors=True)
        self.last_saved = time.perf_counter()
        if self.notice is not None:
            self.notice.consume()  # one save per notice

    def load(self, epoch: int, steps_per_rank: int) -> tuple[dict, Path] | None:
        """The saved state and its directory when it lies inside ``epoch`` (the epoch a restarted
        attempt starts with) and was saved by as many workers taking as many steps, else None:
        an older one is superseded by an epoch checkpoint, and another split of the batches
        (``resources.workers`` changed, which a trial's identity leaves out) cannot go on from
        its position."""
        rank, world = rank_and_world()
        for directory in (self.directory, self._previous):  # .previous: killed between the two renames
            if (directory / STATE_FILE).exists():
                state = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
                if state["epoch"] != epoch:
                    return None
                if (state.get("world"), state.get("steps_per_rank")) != (world, steps_per_rank):
                    get_logger("train").warning(
                        f"ignoring the in-epoch state in {directory}: saved by {state.get('world')} worker(s) taking "
                        f"{state.get('steps_per_rank')} steps per epoch, this attempt has {world} taking {steps_per_rank}; "
                        f"epoch {epoch} starts again")
                    return None
                state["generators"] = torch.load(directory / f"generators-{rank}.pt", weights_only=False)
                return state, directory
        return None

    def clear(self) -> None:
        for directory in (self.directory, self._writing, self._previous):
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        if self.notice is not None:
            self.notice.stop()


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def _any_rank(flag: bool, world: int) -> bool:
    """True on every worker when ``flag`` is true on any (every worker calls it)."""
    if world == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
