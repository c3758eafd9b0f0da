"""Training, one package for every trial kind.

- :mod:`~workloads.training.loop`: the one epoch loop (validation on rank 0, checkpoints,
  early stopping, reports) that every kind runs through its hooks;
- :mod:`~workloads.training.step`: one optimizer step (AdamW, accumulation, clipping, the
  schedule, out-of-memory advice);
- :mod:`~workloads.training.objective`: the encoder and its loss as one module, SIR's
  curriculum objective, GradCache micro-batches;
- :mod:`~workloads.training.rerank`: the re-ranking kind's hooks (cross-encoder, SIR stages);
- :mod:`~workloads.training.spot`: AWS's spot interruption notice, which asks for a save inside the epoch.
"""

from workloads.training.loop import PROGRESS_FILE, SELECTION_METRIC, Reporter, report_epoch, seed_everything
from workloads.training.objective import CurriculumObjective, MicroBatchedPairs, TrainingObjective, load_loss_state
from workloads.training.rerank import (
    CROSS_ENCODER_PREFIX,
    EPOCH_METRIC_PREFIXES,
    EPOCH_METRICS,
    STATE_FILE,
    WEIGHT_METRIC,
    TrainingInputs,
    parameter_groups,
    prefetched,
    train_cross_encoder,
    training_pairs,
    with_augmentation,
)
from workloads.training.step import StepOutOfMemoryError, accumulated_step, adamw, optimization_step

__all__ = ["PROGRESS_FILE", "SELECTION_METRIC", "Reporter", "report_epoch", "seed_everything", "CurriculumObjective",
           "MicroBatchedPairs", "TrainingObjective", "load_loss_state", "CROSS_ENCODER_PREFIX", "EPOCH_METRIC_PREFIXES",
           "EPOCH_METRICS", "STATE_FILE", "WEIGHT_METRIC", "TrainingInputs", "parameter_groups", "prefetched",
           "train_cross_encoder", "training_pairs", "with_augmentation", "StepOutOfMemoryError", "accumulated_step",
           "adamw", "optimization_step"]
