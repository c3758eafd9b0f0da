"""Trial kinds: what a trial is, from what it requires to what it keeps.

A kind names every step of its lifecycle: the trials of other kinds it requires first (a
re-ranking trial that augments with a supervised selector requires that selector), prepare
(on the driver, cached by content), the inputs its workers read, train (per worker, in the
one epoch loop of :mod:`workloads.training.loop`), test the chosen checkpoint, and keep the
result (a selector is installed in the cache every trial shares). The orchestrator
(``orchestrator.core``) and :func:`run_in_process` walk these steps for every kind; a new
kind is one module with its steps plus one entry in :data:`TRIAL_KINDS`, covered by the
contract tests over the registry.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.augmentation.scorers import SUPERVISED_METHODS
from workloads.expansion.kind import COMPLETE_MARKER as EAR_RESULT
from workloads.expansion.kind import EarTrialSpec, ear_key, load_ear_trial, trained_ear
from workloads.expansion.training import STATE_FILE as EAR_STATE
from workloads.expansion.training import EarInputs, keep_ear, prepare_ear, test_ear, train_ear
from workloads.reranking import Reranking
from workloads.selectors.kind import COMPLETE_MARKER as SELECTOR_RESULT
from workloads.selectors.kind import SelectorTrialSpec, selector_key, selector_trial, trained_selector
from workloads.selectors.training import STATE_FILE as SELECTOR_STATE
from workloads.selectors.training import (
    SelectorInputs,
    evaluate_selector_checkpoint,
    install_selector,
    prepare_selector,
    train_selector,
)
from workloads.spec import TrialSpec
from workloads.training import STATE_FILE as RERANK_STATE
from workloads.training import WEIGHT_METRIC, TrainingInputs, train_cross_encoder
from workloads.trial import choose_epoch, evaluate_checkpoint, final_interpolation, prepare_trial


@dataclass(frozen=True)
class TrialKind:
    name: str
    spec: type                                   # pydantic model of the kind's spec
    inputs: type                                 # dataclass of what its workers read
    requires: Callable[[Any], list]              # specs (of any kind) that must be finished first
    prepare: Callable[[Any], Any]                # driver: the data, cached by content
    worker_inputs: Callable[[Any], Any]          # prepared -> what the workers read (an ``inputs``)
    train: Callable                              # train(spec, inputs, report, device=..., resume_from=..., stop_requested=...)
    epochs: Callable[[Any], int]                 # the most epochs it reports (a sweep's pruner counts them)
    test: Callable[..., Reranking]               # (checkpoint, prepared, spec, chosen epoch's metrics, device=None)
    finished: Callable[[Any], Path | None] = lambda spec: None    # a result kept outside the run store, if any
    # keep the chosen one: (spec, checkpoint, summary, device=None), where the test ran
    keep: Callable[..., Path | None] = lambda spec, checkpoint, summary, device=None: None
    key: Callable[[Any], str] | None = None     # identity of a required trial (shared by every trial requiring it)
    # train also takes in_epoch_dir (state saved inside an epoch, optimization.checkpoint_every)
    resumes_in_epoch: bool = False
    result_file: str = ""  # in a kept result's directory: its summary (JSON), written last
    state_file: str = ""   # in an epoch's checkpoint: the resumable optimization state (never part of a logged model)


def _rerank_requires(spec: TrialSpec) -> list:
    required: list = [selector_trial(spec)] if spec.augmentation.method in SUPERVISED_METHODS else []
    for first_stage in (spec.first_stage, spec.data.test_first_stage):
        if first_stage is not None and first_stage.method == "ear":  # it re-ranks what an EAR trial retrieved
            required.append(load_ear_trial(first_stage.run))
    return required


def _rerank_test(checkpoint: Path, prepared, spec: TrialSpec, chosen: dict, device=None) -> Reranking:
    return evaluate_checkpoint(checkpoint, prepared, spec, device,
                               interpolation=final_interpolation(spec, chosen.get(WEIGHT_METRIC)))


def _selector_test(checkpoint: Path, prepared, spec: SelectorTrialSpec, chosen: dict, device=None) -> Reranking:
    return evaluate_selector_checkpoint(checkpoint, prepared, spec, device)


TRIAL_KINDS = {kind.name: kind for kind in (
    TrialKind("rerank", TrialSpec, TrainingInputs, requires=_rerank_requires, prepare=prepare_trial,
              worker_inputs=lambda prepared: prepared.training, train=train_cross_encoder, test=_rerank_test,
              epochs=lambda spec: spec.optimization.epochs * (spec.sir.stages if spec.sir else 1),
              resumes_in_epoch=True, state_file=RERANK_STATE),
    TrialKind("selector", SelectorTrialSpec, SelectorInputs, requires=lambda spec: [], prepare=prepare_selector,
              worker_inputs=lambda prepared: prepared.inputs, train=train_selector,
              test=_selector_test, epochs=lambda spec: spec.selector.epochs,
              finished=trained_selector, keep=install_selector, key=selector_key, result_file=SELECTOR_RESULT,
              state_file=SELECTOR_STATE),
    TrialKind("ear", EarTrialSpec, EarInputs, requires=lambda spec: [], prepare=prepare_ear,
              worker_inputs=lambda prepared: prepared.inputs, train=train_ear, test=test_ear,
              epochs=lambda spec: spec.ear.epochs,
              finished=trained_ear, keep=keep_ear, key=ear_key, result_file=EAR_RESULT,
              state_file=EAR_STATE),
)}


def kind_of(spec) -> TrialKind:
    for kind in TRIAL_KINDS.values():
        if isinstance(spec, kind.spec):
            return kind
    raise TypeError(f"no trial kind runs a {type(spec).__name__}")


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


def run_in_process(spec, checkpoint_root: Path) -> tuple[Any, list[EpochRecord], Reranking]:
    """A trial of any kind without Ray or MLflow (tests, debugging): its requirements first
    (those not finished yet, in-process too), then prepare, train on one process, choose
    the epoch, test it, keep it. Returns (prepared, every epoch's record, the test ranking)."""
    kind = kind_of(spec)
    for required in kind.requires(spec):
        if kind_of(required).finished(required) is None:
            run_in_process(required, checkpoint_root / kind_of(required).name)
    prepared = kind.prepare(spec)
    records: list[EpochRecord] = []

    def keep(metrics: dict[str, float], checkpoint: Path | None) -> None:
        final = None
        if checkpoint is not None:
            final = checkpoint_root / f"epoch-{int(metrics['epoch'])}"
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(checkpoint), final)
        records.append(EpochRecord(dict(metrics), final))

    started = time.perf_counter()
    kind.train(spec, kind.worker_inputs(prepared), keep)
    best = records[choose_epoch([r.metrics for r in records])]
    tested = kind.test(best.checkpoint, prepared, spec, best.metrics)
    best.metrics["trial_seconds"] = time.perf_counter() - started
    kind.keep(spec, best.checkpoint, result_summary(best.metrics, tested))
    return prepared, records, tested
