"""What every kind's epochs report, by name (the loop's and the re-ranking kind's interpolation):
the run store, the sweep and the report read these names, so they live in the layer every kind
shares, apart from any kind."""

from __future__ import annotations

from workloads.evaluation import validation_values
from workloads.evaluation.reranking import Reranking

# What the loop reports per epoch: "epoch", "degenerate_batches" ("stage" with SIR v1/v2), and names with these
# prefixes: val_* (the validation ranking; val_cross_encoder_* the cross-encoder alone and
# val_interpolation_weight the tuned weight when interpolating), train_* (losses) and
# epoch_* (seconds).
EPOCH_METRICS = ("epoch", "stage", "degenerate_batches")  # stage: SIR v1/v2 only
EPOCH_METRIC_PREFIXES = ("val_", "train_", "epoch_")
CROSS_ENCODER_PREFIX = "val_cross_encoder_"  # the cross-encoder alone, logged when interpolating
WEIGHT_METRIC = "val_interpolation_weight"  # the weight tuned on validation at that epoch


def validation_metrics(validation: Reranking) -> dict[str, float]:
    """``val_*`` of the final ranking; with interpolation also the cross-encoder alone and the weight."""
    metrics = validation_values(validation.evaluation)
    if validation.weight is not None:
        metrics.update({f"{CROSS_ENCODER_PREFIX}{k}": v for k, v in validation.cross_encoder.aggregate.items()})
        metrics[WEIGHT_METRIC] = validation.weight
    return metrics
