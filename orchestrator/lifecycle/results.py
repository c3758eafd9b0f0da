"""A trial's outcome, typed: read from its run in the store by schema name, in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import schema


@dataclass
class Ranking:
    """One ranking's measures on one set of queries (``model`` is the final ranking)."""

    model: dict[str, float]
    first_stage: dict[str, float]
    cross_encoder: dict[str, float] = field(default_factory=dict)  # when the final ranking is fused
    weight: float | None = None


@dataclass
class TrialResult:
    """A trial's outcome: its run (empty for a kept result reused without one), whether it was
    reused, the chosen epoch, its validation and test rankings, its timings, and where its
    kind kept its result (None for a kind that keeps none)."""

    run_id: str
    reused: bool
    best_epoch: int
    validation: Ranking
    tests: dict[str, Ranking]  # target name -> its rankings
    timings: dict[str, float]
    kept: Path | None = None

    @classmethod
    def from_metrics(cls, run_id: str, reused: bool, metrics: dict[str, float], target_names: Sequence[str],
                     kept: Path | None = None) -> TrialResult:
        validation = Ranking(schema.measures(metrics, f"{schema.BEST_PREFIX}{schema.VALIDATION_PREFIX}"),
                             schema.measures(metrics, schema.first_stage_prefix("val")),
                             schema.measures(metrics, f"{schema.BEST_PREFIX}{schema.VALIDATION_CROSS_ENCODER_PREFIX}"),
                             metrics.get(f"{schema.BEST_PREFIX}{schema.TUNED_WEIGHT}"))
        tests = {}
        for name in target_names:
            # runs tracked before one vocabulary logged the test weight unprefixed
            weight = metrics.get(schema.weight_metric(name), metrics.get("interpolation_weight") if name == schema.TEST else None)
            tests[name] = Ranking(schema.measures(metrics, schema.target_prefix(name)),
                                  schema.measures(metrics, schema.first_stage_prefix(name)),
                                  schema.measures(metrics, schema.cross_encoder_prefix(name)), weight)
        timings = {k: v for k, v in metrics.items() if k.startswith("time_")}
        return cls(run_id, reused, int(metrics.get(schema.BEST_EPOCH, 0)), validation, tests, timings, kept)
