"""Training, one package for every trial kind.

- :mod:`~workloads.training.loop`: the one epoch loop (validation on rank 0, checkpoints,
  early stopping, reports) that every kind runs through its hooks;
- :mod:`~workloads.training.step`: one optimizer step (AdamW, accumulation, clipping, the
  schedule, out-of-memory advice);
- :mod:`~workloads.training.objective`: the encoder and its loss as one module, GradCache
  micro-batches;
- :mod:`~workloads.training.spot`: AWS's spot interruption notice, which asks for a save inside the epoch.
- :mod:`~workloads.training.epoch_metrics`: what every kind's epochs report, by name (the run store's
  vocabulary of them).
"""

from workloads.training.loop import PROGRESS_FILE, SELECTION_METRIC, Reporter, report_epoch, seed_everything
from workloads.training.objective import MicroBatchedPairs, TrainingObjective, load_loss_state
from workloads.training.step import StepOutOfMemoryError, accumulated_step, adamw, optimization_step

__all__ = [
    "PROGRESS_FILE",
    "SELECTION_METRIC",
    "Reporter",
    "report_epoch",
    "seed_everything",
    "MicroBatchedPairs",
    "TrainingObjective",
    "load_loss_state",
    "StepOutOfMemoryError",
    "accumulated_step",
    "adamw",
    "optimization_step",
]
