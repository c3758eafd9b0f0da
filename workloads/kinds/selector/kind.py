"""The selector trial kind's declaration (``KIND``): a supervised sentence selector trained
with a cross-encoder ranker (select-and-rank), required by the re-ranking trials that augment
with it and installed in the cache they share.

Its steps are :mod:`workloads.kinds.selector.steps` (prepare, test, install) and
:mod:`workloads.kinds.selector.train` (train, once per worker); its spec and identity
:mod:`workloads.kinds.selector.spec`. It has no sweep grid of its own: a grid's cells
require it. Registered with one line in :data:`workloads.kinds.TRIAL_KINDS`.
"""

from __future__ import annotations

from pathlib import Path

from workloads.evaluation.reranking import Reranking
from workloads.kinds.protocol import TrialKind
from workloads.kinds.rerank.augmentation.supervised import TrainedSelectors, serve_selectors
from workloads.kinds.selector.spec import (
    COMPLETE_MARKER,
    SelectorTrialSpec,
    selector_dir,
    selector_key,
    selector_requirement_tags,
    selector_trial,
    trained_selector,
)
from workloads.kinds.selector.steps import evaluate_selector_checkpoint, install_selector, prepare_selector
from workloads.kinds.selector.train import STATE_FILE, SelectorInputs, train_selector


def _test(checkpoint: Path, prepared, spec: SelectorTrialSpec, chosen: dict, device=None) -> Reranking:
    return evaluate_selector_checkpoint(checkpoint, prepared, spec, device)


def _load(directory: Path):
    from workloads.kinds.selector.select_and_rank import SelectAndRank  # noqa: PLC0415 (transformers: only to score)

    return SelectAndRank.load(directory)


# what the re-ranking trials that augment with a supervised selector ask of this kind
serve_selectors(TrainedSelectors(trial=selector_trial, trained=trained_selector, kept_in=selector_dir, load=_load))

KIND = TrialKind(
    "selector", SelectorTrialSpec, SelectorInputs, requires=lambda spec: [], prepare=prepare_selector,
    worker_inputs=lambda prepared: prepared.inputs, train=train_selector, test=_test,
    epochs=lambda spec: spec.selector.epochs, finished=trained_selector, keep=install_selector, key=selector_key,
    result_file=COMPLETE_MARKER, state_file=STATE_FILE,
    described_as="selector", run_kind="selector", requirement_tags=selector_requirement_tags, plan_group="selectors",
    plan_row=lambda spec: {"method": spec.method, "model": spec.model.name, "size": str(spec.training_data.size),
                           "data": spec.selector.data, "k": spec.selector.k},
    title="selector trial", kept_in=selector_dir,
)

__all__ = ["KIND"]
