"""The lifecycle rule of every trial kind, in one place that names no kind.

:func:`run_steps` is the one order of a trial's steps for every kind, wherever it runs: the
trials it requires -> prepare -> train -> choose the epoch (:func:`choose_epoch`, the one
selection rule of every command) -> test every target -> keep (with :func:`result_summary`)
-> log. Each setting carries the steps out its own way (:class:`TrialSteps`): on Ray with the
run store (``orchestrator.lifecycle``), as a sweep's Tune trial (``orchestrator.sweep.tune``)
or in this process (:class:`InProcessSteps`, :func:`run_in_process`). It asks the registry (:mod:`workloads.kinds.registry`) for a spec's
kind and imports nothing from a kind's package.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workloads.evaluation.reranking import Reranking
from workloads.kinds.protocol import TrialKind
from workloads.kinds.registry import kind_of, requirements
from workloads.training import SELECTION_METRIC


def choose_epoch(epoch_metrics: Sequence[Mapping[str, float]]) -> int:
    """The index of the chosen epoch: the best validation nDCG@10 (the fused ranking's when
    interpolating); a tie keeps the earlier epoch. The one selection rule of every command.
    With SIR stages (v1, v2) only the last stage's epochs compete: the last compressor is
    the model SIR evaluates."""
    if not epoch_metrics:
        raise ValueError("no epoch to choose from")
    last_stage = max(m.get("stage", 1) for m in epoch_metrics)
    candidates = [i for i, m in enumerate(epoch_metrics) if m.get("stage", 1) == last_stage]
    return max(candidates, key=lambda i: (epoch_metrics[i][SELECTION_METRIC], -i))


def result_summary(chosen: dict[str, float], tested: Reranking) -> dict[str, float]:
    """What a kept result records: the chosen epoch, its validation metrics, its test metrics."""
    return {"best_epoch": chosen["epoch"], **{f"best_{k}": v for k, v in chosen.items() if k.startswith("val_")},
            **{f"test_{k}": v for k, v in tested.evaluation.aggregate.items()}}


@dataclass
class EpochRecord:
    metrics: dict[str, float]
    checkpoint: Path | None


class TrialSteps(Protocol):
    """How each step of a trial is carried out in one setting: in this process
    (:func:`run_in_process`), on Ray workers tracked in the run store
    (``orchestrator.lifecycle.run``), or as a sweep's Tune trial (``orchestrator.sweep.tune``).
    :func:`run_steps` calls them in the one order."""

    def reused(self, kind: TrialKind, spec) -> Any | None: ...   # the outcome of the same trial done before, or None
    def require(self, kind: TrialKind, spec, required: list) -> None: ...  # the trials it requires, finished first
    def prepare(self, kind: TrialKind, spec) -> Any: ...          # its data (and every target's)
    def train(self, kind: TrialKind, spec, prepared) -> list: ...  # every epoch's metrics and checkpoint
    def test(self, kind: TrialKind, spec, prepared, chosen) -> list: ...  # each target's test, its own first
    def keep(self, kind: TrialKind, spec, chosen, tested: list) -> Path | None: ...  # where the result is kept
    def log(self, kind: TrialKind, spec, epochs: list, chosen, tested: list, kept: Path | None) -> Any: ...  # the outcome
    def stopped(self, error: BaseException) -> None: ...          # a step after prepare raised ``error``


def run_steps(spec, steps: TrialSteps) -> Any:
    """The one lifecycle of every kind, wherever it runs: the trials it requires -> prepare ->
    train -> choose the epoch (:func:`choose_epoch`, on validation) -> test every target ->
    keep -> log. Returns what ``steps`` makes of it."""
    kind = kind_of(spec)
    reused = steps.reused(kind, spec)
    if reused is not None:
        return reused
    steps.require(kind, spec, requirements([spec]))
    prepared = steps.prepare(kind, spec)
    try:
        epochs = steps.train(kind, spec, prepared)
        chosen = epochs[choose_epoch([e.metrics for e in epochs])]
        tested = steps.test(kind, spec, prepared, chosen)
        kept = steps.keep(kind, spec, chosen, tested)
        return steps.log(kind, spec, epochs, chosen, tested, kept)
    except BaseException as exc:
        steps.stopped(exc)
        raise


class InProcessSteps:
    """Each step in this process, without Ray or MLflow: required trials not finished yet run
    in process too, every epoch's checkpoint is moved under ``checkpoint_root``, the trial is
    tested on its own test data."""

    def __init__(self, checkpoint_root: Path) -> None:
        self.checkpoint_root = checkpoint_root

    def reused(self, kind: TrialKind, spec) -> None:
        return None

    def require(self, kind: TrialKind, spec, required: list) -> None:
        for each in required:
            if kind_of(each).finished(each) is None:
                run_in_process(each, self.checkpoint_root / kind_of(each).name)

    def prepare(self, kind: TrialKind, spec):
        self.prepared = kind.prepare(spec)
        return self.prepared

    def train(self, kind: TrialKind, spec, prepared) -> list[EpochRecord]:
        records: list[EpochRecord] = []

        def report(metrics: dict[str, float], checkpoint: Path | None) -> None:
            final = None
            if checkpoint is not None:
                final = self.checkpoint_root / f"epoch-{int(metrics['epoch'])}"
                final.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(checkpoint), final)
            records.append(EpochRecord(dict(metrics), final))

        self.started = time.perf_counter()
        kind.train(spec, kind.worker_inputs(prepared), report)
        return records

    def test(self, kind: TrialKind, spec, prepared, chosen: EpochRecord) -> list[Reranking]:
        tested = kind.test(chosen.checkpoint, prepared, spec, chosen.metrics)
        chosen.metrics["trial_seconds"] = time.perf_counter() - self.started
        return [tested]

    def keep(self, kind: TrialKind, spec, chosen: EpochRecord, tested: list[Reranking]) -> Path | None:
        return kind.keep(spec, chosen.checkpoint, result_summary(chosen.metrics, tested[0]))

    def log(self, kind: TrialKind, spec, epochs: list[EpochRecord], chosen, tested: list[Reranking], kept):
        return self.prepared, epochs, tested[0]

    def stopped(self, error: BaseException) -> None:
        return None


def run_in_process(spec, checkpoint_root: Path) -> tuple[Any, list[EpochRecord], Reranking]:
    """A trial of any kind without Ray or MLflow (tests, debugging), through :func:`run_steps`:
    its requirements first (those not finished yet, in process too), then prepare, train on
    one process, choose the epoch, test it, keep it. Returns (prepared, every epoch's record,
    the test ranking)."""
    return run_steps(spec, InProcessSteps(checkpoint_root))


__all__ = ["EpochRecord", "InProcessSteps", "TrialSteps", "choose_epoch", "result_summary", "run_in_process", "run_steps"]
