"""Trial kinds: what a Ray Train worker can run. A kind is its typed spec, the inputs its
workers read (prepared on the driver) and its per-worker training loop.

A new kind is one module with those three plus one entry in :data:`TRIAL_KINDS`; the
orchestrator's trainer (``orchestrator.core.execution.make_trainer``) reads the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workloads.selectors.spec import SelectorTrialSpec
from workloads.selectors.training import SelectorInputs, train_selector
from workloads.spec import TrialSpec
from workloads.training import TrainingInputs, train_cross_encoder


@dataclass(frozen=True)
class TrialKind:
    name: str
    spec: type      # pydantic model of the kind's spec
    inputs: type    # dataclass of what its workers read
    train: Callable  # train(spec, inputs, report, device=..., resume_from=...)


TRIAL_KINDS = {kind.name: kind for kind in (
    TrialKind("rerank", TrialSpec, TrainingInputs, train_cross_encoder),
    TrialKind("selector", SelectorTrialSpec, SelectorInputs, train_selector),
)}


def kind_of(spec) -> TrialKind:
    for kind in TRIAL_KINDS.values():
        if isinstance(spec, kind.spec):
            return kind
    raise TypeError(f"no trial kind runs a {type(spec).__name__}")
