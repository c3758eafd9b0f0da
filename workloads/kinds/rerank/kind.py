"""The re-ranking trial kind's declaration (``KIND``): what the control plane asks of it.

Its steps are :mod:`workloads.kinds.rerank.steps` (prepare, test) and
:mod:`workloads.kinds.rerank.train` (the cross-encoder's training); its spec
:mod:`workloads.kinds.rerank.spec`; its identity and axes :mod:`workloads.kinds.rerank.identity`;
its sweep grid :mod:`workloads.kinds.rerank.grid`. The default kind: a trial file without
``kind:`` holds re-ranking trials. Registered with one line in :data:`workloads.kinds.TRIAL_KINDS`.
"""

from __future__ import annotations

from pathlib import Path

from workloads.evaluation.reranking import Reranking
from workloads.kinds.protocol import SELECTOR_DATA_TAG, SearchedParameter, TrialKind
from workloads.kinds.rerank.augmentation.scorers import SUPERVISED_METHODS
from workloads.kinds.rerank.augmentation.supervised import trained_selectors
from workloads.kinds.rerank.grid import RERANK_GRID
from workloads.kinds.rerank.identity import rerank_axes, rerank_key
from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE
from workloads.kinds.rerank.preflight import configuration_problems, preflight_trial
from workloads.kinds.rerank.spec import LOSS_HYPERPARAMETERS, SIRSpec, TrialSpec
from workloads.kinds.rerank.steps import evaluate_checkpoint, final_interpolation, prepare_trial
from workloads.kinds.rerank.train import TrainingInputs, train_cross_encoder
from workloads.losses import PARAMETERS, searchable_parameters
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.retrieval.mining import mining_requires
from workloads.training.epoch_metrics import WEIGHT_METRIC


def check_levels(levels: list[int]) -> None:
    """SIR levels a sweep may search: the curriculum's own rule (shrinking, at least 2)."""
    SIRSpec(variant="v3", levels=levels)


# What a re-ranking cell's search may draw, where each value sits in its spec: the learning
# rate, every loss hyper-parameter a loss declares searchable (``workloads.losses``, in
# LossSpec's order: a new searchable parameter joins the search space), k_a and SIR's levels.
SEARCHED = (
    SearchedParameter(name="learning_rate", path=("optimization", "learning_rate"), description=""),
    *(SearchedParameter(name=field, path=("loss", field), description=PARAMETERS[field].description,
                        alias=PARAMETERS[field].alias)
      for field in LOSS_HYPERPARAMETERS if PARAMETERS[field].searchable),
    SearchedParameter(name="k", path=("augmentation", "k"), spaces=("choices",), prepares_data=True,
                      description="k_a, the sentences an augmenter keeps"),
    SearchedParameter(name="sir_levels", path=("sir", "levels"), spaces=("levels",),
                      description="SIR's K per level (cells with a curriculum)",
                      convert=lambda value: [int(k) for k in str(value).split("-")], check=check_levels),
)


def searched_in(spec: TrialSpec) -> tuple[str, ...]:
    """The hyper-parameters searched in a cell: the learning rate, its losses' searchable ones,
    k_a where it augments, the levels where a curriculum compresses."""
    names = ["learning_rate", *searchable_parameters(spec.loss)]
    if spec.augmentation.method != "none":
        names.append("k")
    if spec.sir is not None and spec.sir.variant != "v0":
        names.append("sir_levels")
    return tuple(names)


def requires(spec: TrialSpec) -> list:
    """A supervised selector it augments with; the kept trials its first stages read (an EAR trial's run)."""
    required: list = [trained_selectors().trial(spec)] if spec.augmentation.method in SUPERVISED_METHODS else []
    for first_stage in (spec.first_stage, spec.data.test_first_stage):
        if first_stage is not None:
            required += FIRST_STAGES[first_stage.method].requires(first_stage)
    return required + mining_requires(spec.training_data.mining)  # a dense trial whose encoder mines the negatives


def first_stages_of(spec: TrialSpec) -> list[tuple]:
    """(where, collection, split, first stage) of every split a trial's first stages serve."""
    data = spec.data
    test_collection = data.test_collection or data.collection
    served = [("first_stage", data.collection, data.train_split, spec.first_stage)]
    if data.validation_split:
        served.append(("first_stage", data.collection, data.validation_split, spec.first_stage))
    served.append(("data.test_first_stage", test_collection, data.test_split, data.test_first_stage) if data.test_first_stage
                  else ("first_stage", test_collection, data.test_split, spec.first_stage))
    return served


def cell_tags(spec: TrialSpec) -> dict[str, str]:
    """Which data trained a supervised selector (``full`` leaks every training query's labels
    into the cell: the method asks to say so)."""
    selector = spec.augmentation.selector
    return {SELECTOR_DATA_TAG: selector.data} if selector is not None else {}


def cell_pairs(spec: TrialSpec, sweep, judged_queries) -> tuple[int | None, int | None, int | None]:
    """(training pairs of one trial, its validation pairs, the winner's test pairs); None where a
    size is not known here (``size: full``, a validation split of unknown size, a test set)."""
    epochs = KIND.epochs(spec)
    size = spec.training_data.size if isinstance(spec.training_data.size, int) else None
    train = None if size is None else size * (2 if spec.augmentation.method != "none" else 1) * epochs
    if spec.data.validation_split is None:
        queries = spec.data.validation_queries  # carved from the training split
    else:
        queries = spec.data.validation_cap or judged_queries(spec.data.collection, spec.data.validation_split)
    validation = None if queries is None else queries * spec.first_stage.validation_depth * epochs
    own = judged_queries(spec.data.test_collection or spec.data.collection, spec.data.test_split)
    zero_shot = [(judged_queries(z.collection, z.split), (z.first_stage or spec.first_stage).test_depth) for z in sweep.zero_shot]
    # robustness perturbs the trial's own test queries, not a zero-shot target's (at most all of them: those with a variant)
    test = (None if own is None or any(n is None for n, _ in zero_shot)
            else own * (spec.data.test_first_stage or spec.first_stage).test_depth * (1 + len(spec.robustness))
            + sum(n * depth for n, depth in zero_shot))
    return train, validation, test


def _test(checkpoint: Path, prepared, spec: TrialSpec, chosen: dict, device=None) -> Reranking:
    return evaluate_checkpoint(checkpoint, prepared, spec, device,
                               interpolation=final_interpolation(spec, chosen.get(WEIGHT_METRIC)))


KIND = TrialKind(
    "rerank", TrialSpec, TrainingInputs, requires=requires, prepare=prepare_trial,
    worker_inputs=lambda prepared: prepared.training, train=train_cross_encoder, test=_test,
    epochs=lambda spec: spec.optimization.epochs * (spec.sir.stages if spec.sir else 1), key=rerank_key,
    resumes_in_epoch=True, state_file=STATE_FILE,
    described_as="re-ranking", run_kind="trial", searched=SEARCHED, searched_in=searched_in, axes=rerank_axes,
    cell_tags=cell_tags, grid=RERANK_GRID, first_stages_of=first_stages_of, cell_pairs=cell_pairs,
    preflight=preflight_trial, configuration_problems=configuration_problems,
)

__all__ = ["KIND", "SEARCHED"]
