"""Trial kinds: what a trial is, from what it requires to what it keeps.

A kind names every step of its lifecycle: the trials of other kinds it requires first (a
re-ranking trial that augments with a supervised selector requires that selector), prepare
(on the driver, cached by content), the inputs its workers read, train (per worker, in the
one epoch loop of :mod:`workloads.training.loop`), test the chosen checkpoint, and keep the
result (a selector is installed in the cache every trial shares); and everything the control
plane asks of it: its searched parameters, grid, tags, first stages and cost
(:class:`~workloads.kinds.protocol.TrialKind`). :func:`run_steps` is the one order of these
steps for every kind, wherever it runs: on Ray with the run store (``orchestrator.lifecycle``)
or in this process (:func:`run_in_process`).

A new kind is a package ``workloads/kinds/<kind>/`` whose ``kind.py`` declares ``KIND``, plus
one line in :data:`TRIAL_KINDS` below (or :func:`register_kind` at run time); registering it
registers the first stages and miners it serves. The contract tests run over the registry.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from workloads.evaluation.reranking import Reranking
from workloads.kinds.dense.kind import KIND as DENSE
from workloads.kinds.ear.kind import KIND as EAR
from workloads.kinds.protocol import GridCell, GridError, KindGrid, SearchedParameter, TrialKind
from workloads.kinds.rerank.kind import KIND as RERANK
from workloads.kinds.rerank.steps import choose_epoch
from workloads.kinds.selector.kind import KIND as SELECTOR
from workloads.retrieval.first_stage import register_first_stage
from workloads.retrieval.mining import register_miner

TRIAL_KINDS: dict[str, TrialKind] = {}
DEFAULT_KIND = "rerank"  # a trial file (or a sweep's base) without ``kind:`` holds re-ranking trials


def register_kind(kind: TrialKind) -> None:
    """Add a kind to :data:`TRIAL_KINDS`, with the first stages and miners it serves."""
    known = TRIAL_KINDS.get(kind.name)
    if known is not None and known is not kind:
        raise ValueError(f"trial kind '{kind.name}' is registered twice")
    for first_stage in kind.first_stages:
        register_first_stage(first_stage)
    for miner in kind.miners:
        register_miner(miner)
    TRIAL_KINDS[kind.name] = kind


for _kind in (RERANK, SELECTOR, EAR, DENSE):  # the registry: one entry per kind
    register_kind(_kind)


def kind_of(spec) -> TrialKind:
    for kind in TRIAL_KINDS.values():
        if isinstance(spec, kind.spec):
            return kind
    raise TypeError(f"no trial kind runs a {type(spec).__name__}")


def kind_named(name: str | None) -> TrialKind:
    """The kind a file's ``kind:`` names (None: the default kind); KeyError for an unknown name."""
    return TRIAL_KINDS[DEFAULT_KIND if name is None else name]


def kind_with_run_kind(run_kind: str) -> TrialKind | None:
    """The kind whose runs carry this KIND_TAG value, if any."""
    return next((kind for kind in TRIAL_KINDS.values() if kind.run_kind == run_kind), None)


def requirements(specs) -> list:
    """The distinct trials (of any kind) that ``specs`` require first, in order, each once."""
    found: dict[str, object] = {}
    for spec in specs:
        for required in kind_of(spec).requires(spec):
            found.setdefault(kind_of(required).key(required), required)
    return list(found.values())


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
    (:func:`run_in_process`), or on Ray workers tracked in the run store
    (``orchestrator.lifecycle.run``). :func:`run_steps` calls them in the one order."""

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
    train -> choose the epoch (:func:`~workloads.kinds.rerank.steps.choose_epoch`, on
    validation) -> test every target -> keep -> log. Returns what ``steps`` makes of it."""
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


__all__ = ["DEFAULT_KIND", "TRIAL_KINDS", "EpochRecord", "GridCell", "GridError", "KindGrid", "SearchedParameter",
           "TrialKind", "TrialSteps", "kind_named", "kind_of", "kind_with_run_kind", "register_kind", "requirements",
           "result_summary", "run_in_process", "run_steps"]
