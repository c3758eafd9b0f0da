"""What a trial's training leaves: every epoch's metrics, the chosen epoch, the summary a trial
run holds (the same names for ``run``, a required trial and a sweep's Tune trial)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core import schema
from orchestrator.core.execution import EpochResult
from orchestrator.core.tracking import Tracker
from workloads.kinds import choose_epoch

# the epoch metrics (reported by the loop, once per attempt or per epoch) that break the overhead down
OVERHEAD_PARTS = {schema.TIME_STARTUP: "epoch_startup_seconds", schema.TIME_SETUP: "epoch_setup_seconds",
                  schema.TIME_CHECKPOINT: "epoch_checkpoint_seconds"}
# what a trial run holds about its training besides best_*: training_summary and timing
SUMMARY_METRICS = frozenset({schema.BEST_EPOCH, schema.TIME_TRAINING, schema.TIME_PER_EPOCH, schema.TIME_TRAIN_WALL,
                             schema.TIME_OVERHEAD, *OVERHEAD_PARTS})


def chosen(epochs: Sequence[EpochResult]) -> EpochResult:
    """The epoch every command tests (see ``workloads.kinds.choose_epoch``)."""
    return epochs[choose_epoch([e.metrics for e in epochs])]


def training_summary(epoch_metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """What a trial run holds about its training once it ended: the chosen epoch, its ``val_*``
    as ``best_val_*``, and the time spent in the loop. The same names for every command."""
    best = epoch_metrics[choose_epoch(epoch_metrics)]
    training = sum(m["epoch_train_seconds"] + m.get("epoch_validation_seconds", 0.0) for m in epoch_metrics)
    return {
        schema.BEST_EPOCH: best["epoch"],
        **{f"{schema.BEST_PREFIX}{k}": v for k, v in best.items() if k.startswith(schema.VALIDATION_PREFIX)},
        schema.TIME_TRAINING: training,
        schema.TIME_PER_EPOCH: sum(m["epoch_train_seconds"] for m in epoch_metrics) / len(epoch_metrics),
        **{name: sum(m.get(part, 0.0) for m in epoch_metrics) for name, part in OVERHEAD_PARTS.items()},
    }


def log_training(tracker: Tracker, run_id: str, epochs: Sequence[EpochResult]) -> tuple[dict[str, float], EpochResult]:
    """Log every epoch's metrics (step = epoch) on ``run_id``; returns the training summary
    and the chosen epoch."""
    for epoch in epochs:
        tracker.log_metrics(run_id, {k: v for k, v in epoch.metrics.items() if schema.is_epoch_metric(k)},
                            step=int(epoch.metrics["epoch"]))
    return training_summary([e.metrics for e in epochs]), chosen(epochs)


def timing(train_wall: float, summary: dict[str, float]) -> dict[str, float]:
    """Ray Train's wall time and the overhead over the loop's own time."""
    return {schema.TIME_TRAIN_WALL: train_wall, schema.TIME_OVERHEAD: train_wall - summary[schema.TIME_TRAINING]}
