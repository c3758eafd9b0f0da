"""One optimizer step, the same for every trial kind: AdamW (fused where the device has the
kernel), gradient accumulation and GradCache micro-batches, clipping, the schedule, and one
rule for a step that does not fit in memory."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from workloads.losses.base import PairStructure
from workloads.training.loop import EarlyStopping, rank_and_world, rank_generators, restore_generators
from workloads.training.objective import MicroBatchedPairs, TrainingObjective


class StepOutOfMemoryError(MemoryError):
    """A training step that does not fit, with the settings that make it smaller (a sweep
    records it as ``failure=oom`` and does not retry it)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """The one rule for an allocation that failed (CUDA's error; the CPU allocator's message)."""
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in str(exc)



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



_PARAMETERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _parameters(objective: torch.nn.Module) -> list[torch.nn.Parameter]:
    """``objective.parameters()`` in its order (the clipped norm's summation order), listed once
    per objective instead of walking its ~100 modules every step. An objective's parameters are
    fixed once it is built (a new stage builds a new objective)."""
    parameters = _PARAMETERS.get(objective)
    if parameters is None:
        parameters = _PARAMETERS[objective] = list(objective.parameters())
    return parameters


class RunningLoss:
    """An epoch's running sum of step losses, kept on the device: adding a step's loss queues
    one fp64 add and reads nothing, so the host never waits for the device inside an epoch.
    :meth:`value` reads it (once per logging interval and at the epoch's end). fp64, each
    step's fp32 loss widened exactly: the sum 617b804 kept as a Python float, step by step
    (``total += float(loss)``), bit for bit. Saved with an in-epoch checkpoint as that float,
    and restored from it, so a resumed epoch reports the uninterrupted epoch's mean."""

    def __init__(self, device: torch.device, start: float = 0.0) -> None:
        self.sum = torch.tensor(start, dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor) -> None:
        self.sum.add_(loss)  # fp32 loss promoted to fp64, then one IEEE add: Python's float += float(loss)

    def value(self) -> float:
        return self.sum.item()


def optimization_step(wrapped: torch.nn.Module, objective: TrainingObjective, optimizer: torch.optim.Optimizer,
                      scheduler, scaler: torch.amp.GradScaler, inputs: dict[str, torch.Tensor], structure: PairStructure,
                      max_grad_norm: float, micro_batch_size: int | None = None) -> torch.Tensor:
    """One step on one batch (:func:`accumulated_step` with a single micro-step)."""
    return accumulated_step(wrapped, objective, optimizer, scheduler, scaler, [(inputs, structure)], max_grad_norm,
                            micro_batch_size)


def accumulated_step(wrapped: torch.nn.Module, objective: TrainingObjective, optimizer: torch.optim.Optimizer,
                     scheduler, scaler: torch.amp.GradScaler, micro_steps: list[tuple[dict[str, torch.Tensor], PairStructure]],
                     max_grad_norm: float, micro_batch_size: int | None = None,
                     before_each: Callable[[int], None] | None = None,
                     parts: dict[str, float | torch.Tensor] | None = None) -> torch.Tensor:
    """One optimizer step over ``micro_steps`` batches (gradient accumulation): each batch's loss,
    divided by their number, through ``wrapped`` (the objective, or its DDP wrapper), backward;
    then clip every trainable parameter's gradient (the loss's own too), step, schedule.
    Returns the mean of the batches' losses. Where each loss is a mean over its batch, k
    accumulated batches of b pairs make the update of one batch of k * b pairs.

    Under DDP the gradients are averaged across workers once per step: every micro-step but the
    last runs in ``no_sync``. With ``micro_batch_size`` the encoder runs in micro-batches
    (:class:`MicroBatchedPairs`) outside DDP's forward, so the gradients are averaged across
    workers here, after the last batch. ``before_each(i)`` runs before batch i (per-batch seeding);
    ``parts`` accumulates the step's mean of each named part of the loss (``loss_fn.last_parts``),
    as fp64 tensors on the device.

    The mean loss stays on the loss's device (a 0-d fp32 tensor): nothing in the step waits for
    the device, so the host can queue the next step while this one runs; the epoch loop sums
    it there and reads the sum once per logging interval (:class:`RunningLoss`)."""
    optimizer.zero_grad(set_to_none=True)
    count = len(micro_steps)
    total = None
    _, world = rank_and_world()
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
        # 617b804 summed 0 + loss / count on the CPU: the same fp32 operations, on the device
        total = loss.detach() / count if total is None else total + loss.detach() / count
        if parts is not None:
            for name, value in objective.loss_fn.last_parts.items():
                # on the device, in fp64: what 617b804 summed as Python floats, float(value) / count, bit for bit
                parts[name] = parts.get(name, 0.0) + value.double() / count
    parameters = _parameters(objective)
    if micro_batch_size is not None and world > 1:
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm, foreach=None)  # None: foreach on CPU and CUDA alike
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()
    return total



def optimization_state(optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler) -> dict:
    """What resumes an optimization inside a trial: the optimizer, its schedule, fp16's loss scale."""
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}


def resumed_state(resume_from: Path | None, state_file: str, optimizer: torch.optim.Optimizer, scheduler,
                  scaler: torch.amp.GradScaler, device: torch.device) -> dict | None:
    """The state saved with a checkpoint (None without one), its optimization restored: absent
    after a trial's last epoch (nothing left to train), the loss scale only where fp16 saved one.
    This worker's random generators are restored too (the last thing before its next epoch)."""
    if resume_from is None or not (Path(resume_from) / state_file).exists():
        return None
    state = torch.load(Path(resume_from) / state_file, map_location=device, weights_only=False)
    if "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        generators = rank_generators(state, *rank_and_world())
        if generators is not None:
            restore_generators(generators)
    return state


def data_parallel(module: torch.nn.Module, world: int, device: torch.device,
                  find_unused_parameters: bool = False) -> torch.nn.Module:
    """``module`` as the step calls it: wrapped in DistributedDataParallel when ``world`` > 1
    workers train it (on a GPU, on this worker's device), else ``module`` itself."""
    if world <= 1:
        return module
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                                     find_unused_parameters=find_unused_parameters)


def start_or_resume(hooks, resume_from: Path | None, patience: int | None) -> None:
    """Set a kind's epoch hooks where training starts: the loss scaler (fp16 only), the first
    epoch and the early stopping, restored with the optimization state from ``resume_from``'s
    ``hooks.state_file`` when a checkpoint is given. The hooks hold ``objective`` (its
    ``amp_dtype``), ``optimizer``, ``scheduler``, ``device`` and ``say``."""
    hooks.scaler = torch.amp.GradScaler("cuda", enabled=hooks.objective.amp_dtype == torch.float16)
    hooks.first_epoch = 1
    state = resumed_state(resume_from, hooks.state_file, hooks.optimizer, hooks.scheduler, hooks.scaler, hooks.device)
    if state is not None:
        hooks.first_epoch = state["epoch"] + 1
        hooks.say(f"resumed from {resume_from} after epoch {state['epoch']}")
    hooks.stopping = EarlyStopping.restored(patience, state)


def checked_step(advice: str, *args, **kwargs) -> torch.Tensor:
    """:func:`accumulated_step`, with a step that does not fit raised as :class:`StepOutOfMemoryError`
    carrying ``advice`` (what makes the kind's step smaller)."""
    try:
        return accumulated_step(*args, **kwargs)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise StepOutOfMemoryError(advice) from exc
