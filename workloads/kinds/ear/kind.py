"""The EAR trial kind's declaration (``KIND``): what the control plane asks of it.

Its steps are :mod:`workloads.kinds.ear.steps` (prepare, test, keep) and
:mod:`workloads.kinds.ear.train` (train, once per worker); its preflight
:mod:`workloads.kinds.ear.preflight`; its spec and identity :mod:`workloads.kinds.ear.spec`;
its sweep grid :mod:`workloads.kinds.ear.grid`; the first stage it serves (``method: ear``)
:mod:`workloads.kinds.ear.first_stage`. Registered with one line in
:data:`workloads.kinds.TRIAL_KINDS`.
"""

from __future__ import annotations

from workloads.kinds.ear.first_stage import EAR_FIRST_STAGE
from workloads.kinds.ear.grid import EAR_GRID
from workloads.kinds.ear.preflight import ear_preflight
from workloads.kinds.ear.report import ear_report
from workloads.kinds.ear.spec import COMPLETE_MARKER, EarTrialSpec, ear_axes, ear_dir, ear_key, ear_requirement_tags, trained_ear
from workloads.kinds.ear.steps import keep_ear, prepare_ear, test_ear
from workloads.kinds.ear.train import STATE_FILE, EarInputs, train_ear
from workloads.kinds.protocol import SearchedParameter, TrialKind

# What an EAR cell's search draws, and where each value sits in its trial spec.
SEARCHED = (
    SearchedParameter(name="learning_rate", path=("ear", "learning_rate"), description=""),
    SearchedParameter(name="alpha", path=("ear", "alpha"), description="EAR: the margin per rank of difference"),
    SearchedParameter(name="max_rank", path=("ear", "max_rank"), spaces=("choices",),
                      description="EAR: the label of an expansion that finds nothing (each above ear.depth)"),
    SearchedParameter(name="n", path=("expansion", "n"), spaces=("choices",), prepares_data=True,
                      description="EAR: expansions per query (each a prepared set of its own)"),
)


def cell_pairs(spec: EarTrialSpec, sweep, judged_queries) -> tuple[int | None, int | None, int | None]:
    """An EAR cell's pairs, at its largest searched n: every training query's n expansions per
    epoch (at most: queries whose expansions all rank alike are skipped), every validation
    query's per epoch, then the winner's test and its keeping (every query's expansions once)."""
    n = max(sweep.search.n.choices) if sweep.search.n is not None else spec.expansion.n
    data = spec.data
    train_queries = judged_queries(data.collection, data.train_split)
    if data.validation_split is None:
        validation_queries = data.validation_queries
        train_queries = None if train_queries is None or validation_queries is None else train_queries - validation_queries
    else:
        validation_queries = data.validation_cap or judged_queries(data.collection, data.validation_split)
    test_queries = judged_queries(data.collection, data.test_split)
    epochs = spec.ear.epochs
    train = None if train_queries is None else train_queries * n * epochs
    validation = None if validation_queries is None else validation_queries * n * epochs
    known = None not in (train_queries, validation_queries, test_queries)
    test = (train_queries + validation_queries + 2 * test_queries) * n if known else None
    return train, validation, test


KIND = TrialKind(
    "ear", EarTrialSpec, EarInputs, requires=lambda spec: [], prepare=prepare_ear,
    worker_inputs=lambda prepared: prepared.inputs, train=train_ear, test=test_ear, epochs=lambda spec: spec.ear.epochs,
    finished=trained_ear, keep=keep_ear, key=ear_key, result_file=COMPLETE_MARKER, state_file=STATE_FILE,
    described_as="EAR", run_kind="ear", searched=SEARCHED, axes=ear_axes, requirement_tags=ear_requirement_tags,
    grid=EAR_GRID, first_stages=(EAR_FIRST_STAGE,), cell_pairs=cell_pairs, plan_group="ear_trials",
    plan_row=lambda spec: {"reranker": spec.ear.reranker, "expansion": f"{spec.expansion.source}-{spec.expansion.n}",
                           "model": spec.model.name},
    title="EAR trial", preflight=ear_preflight, kept_in=ear_dir, report=ear_report,
)

__all__ = ["KIND", "SEARCHED"]
