"""What a trial kind declares: the :class:`TrialKind` every kind's package fills in
(``workloads/kinds/<kind>/kind.py``), registered once in :data:`workloads.kinds.TRIAL_KINDS`.

Everything the control plane knows about a kind it asks the declaration, never the kind's
name: its spec and ``kind:`` name, its lifecycle steps (requires, prepare, train, test, keep),
its identity, the parameters a sweep searches in its cells (:class:`SearchedParameter`,
generated into the sweep's search space as the losses' ``Parameter`` are), its grid
(:class:`KindGrid`: axes, cells, their tags), the first stages it serves, and its cost for
the estimate. Also here: what every kind's preflight shares (:class:`Problems`,
:func:`check_collections`) and what ``orchestrate run`` shows of a trial whose kind reports
its own result (:class:`KindReport`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.core.errors import InputError
from workloads.core.paths import stable_key
from workloads.data.identity import local_directory
from workloads.retrieval.mining import MINERS

# A tag a kind's runs carry that the control plane reads (the report's table of selectors): on
# a selector run and on the cells it serves, the data it was trained on, cell (the cell's N
# pairs) or full (every training query).
SELECTOR_DATA_TAG = "rerank_lab.selector_data"


@dataclass(frozen=True, kw_only=True)
class SearchedParameter:
    """A hyper-parameter a sweep may search in a kind's cells, declared once.

    ``name``: its key under a sweep's ``search:`` (``alias`` when the YAML name differs, as
    ``lambda`` for ``lambda_``) and its MLflow param; ``path``: where the value goes in the
    spec's dump (``("ear", "alpha")``); ``spaces``: what ``search:`` may give it, ``range``
    (low/high/log), ``choices`` or ``levels`` (SIR schedules); ``convert``: the spec's value of
    a sampled one (``"48-16"`` -> ``[48, 16]``); ``check``: raises ValueError for a value of
    ``search:`` the spec can never take (SIR levels that do not shrink), when the sweep file is read."""

    name: str
    path: tuple[str, ...]
    description: str
    spaces: tuple[str, ...] = ("range", "choices")
    alias: str | None = None
    convert: Callable[[Any], Any] | None = None
    prepares_data: bool = False  # each value is a prepared set of its own (k_a's augmentations, n's expansions)
    check: Callable[[Any], None] | None = None  # a value of search: the spec can never take raises ValueError

    def compatible(self, other: SearchedParameter) -> bool:
        """Two kinds declaring one name alike (where it goes in their specs may differ)."""
        return (self.spaces, self.alias) == (other.spaces, other.alias)


class GridError(ValueError):
    """A grid whose entries would collapse into one cell: ``entries`` are the (axis, index) pairs involved."""

    def __init__(self, message: str, entries: list[tuple[str, int]]):
        super().__init__(message)
        self.entries = entries

    def __reduce__(self):  # picklable (a Ray worker's error reaches the driver pickled)
        return type(self), (str(self), self.entries)


@dataclass(frozen=True)
class GridCell:
    """A cell a kind's grid expands to: what ``orchestrator.sweep.grid.Cell`` is made of."""

    key: str
    axes: dict[str, str]
    spec: Any
    unavailable: str | None  # why no workload can run this cell yet, else None
    is_baseline: bool

    @classmethod
    def of(cls, sweep_name: str, spec: Any, axes: dict[str, str]) -> GridCell:
        """The cell of a kind whose every cell can run and none is a baseline: ``axes`` less the
        collection (a sweep's one collection) keyed under the sweep, its spec named after the key."""
        axes = {axis: value for axis, value in axes.items() if axis != "collection"}
        key = "cell-" + stable_key(sweep_name, sorted(axes.items()))
        return cls(key, axes, spec.model_copy(update={"name": f"{sweep_name}.{key}"}), None, False)


@dataclass(frozen=True, kw_only=True)
class KindGrid:
    """A sweep's ``grid:`` of one kind.

    ``spec``: its pydantic model; ``marker``: a key whose presence in ``grid:`` says it is this
    kind's (None: the default kind's grid); ``describe``: its lists, for the message when base
    and grid disagree; ``expand(sweep)``: every cell; ``check_base(sweep)``: raise ValueError
    for a ``base`` key the grid sets; ``axis_values``: grid lists whose values must be
    distinct; ``zero_shot``: whether winners are tested on ``zero_shot`` targets too; ``shape(grid)``:
    what the grid is, in a sentence."""

    spec: type
    expand: Callable[[Any], list[GridCell]]
    check_base: Callable[[Any], None]
    axis_values: tuple[str, ...]
    marker: str | None = None
    describe: str = ""
    zero_shot: bool = True
    shape: Callable[[Any], str] = lambda grid: ""  # what the grid is, in a sentence (the experiment's description)


def _no_first_stage(spec) -> list:
    return []


def _model_of(spec) -> list[tuple[str, str]]:
    model = getattr(spec, "model", None)
    return [("model.name", model.name)] if model is not None else []


@dataclass(frozen=True)
class TrialKind:
    """A trial kind: every step of its lifecycle and everything the control plane asks of it.

    The lifecycle: ``requires`` (specs of any kind that must be finished first), ``prepare``
    (driver: the data, cached by content), ``worker_inputs`` (prepared -> what the workers
    read, an ``inputs``), ``train(spec, inputs, report, device=..., resume_from=...,
    stop_requested=...)`` (per worker), ``epochs`` (the most it reports), ``test(checkpoint,
    prepared, spec, chosen epoch's metrics, device=None)``, ``finished`` (a result kept outside
    the run store, if any) and ``keep(spec, checkpoint, summary, device=None)``."""

    name: str                                    # its YAML ``kind:``
    spec: type                                   # pydantic model of the kind's spec
    inputs: type                                 # dataclass of what its workers read
    requires: Callable[[Any], list]              # specs (of any kind) that must be finished first
    prepare: Callable[[Any], Any]                # driver: the data, cached by content
    worker_inputs: Callable[[Any], Any]          # prepared -> what the workers read (an ``inputs``)
    train: Callable                              # train(spec, inputs, report, device=..., resume_from=..., stop_requested=...)
    epochs: Callable[[Any], int]                 # the most epochs it reports (a sweep's pruner counts them)
    test: Callable                               # (checkpoint, prepared, spec, chosen epoch's metrics, device=None) -> Reranking
    finished: Callable[[Any], Path | None] = lambda spec: None    # a result kept outside the run store, if any
    # keep the chosen one: (spec, checkpoint, summary, device=None), where the test ran
    keep: Callable[..., Path | None] = lambda spec, checkpoint, summary, device=None: None
    key: Callable[[Any], str] | None = None     # identity of its result (a required one's is shared by every trial requiring it)
    # train also takes in_epoch_dir (state saved inside an epoch, optimization.checkpoint_every)
    resumes_in_epoch: bool = False
    result_file: str = ""  # in a kept result's directory: its summary (JSON), written last
    state_file: str = ""   # in an epoch's checkpoint: the resumable optimization state (never part of a logged model)
    # --- what the control plane asks of it (sweeps, tags, messages, the estimate)
    described_as: str = ""                       # how messages name its cells and sweeps: "re-ranking", "EAR"
    run_kind: str = ""                           # the KIND_TAG value of its runs (default: its name)
    searched: tuple[SearchedParameter, ...] = ()  # what a sweep may search in its cells
    searched_in: Callable[[Any], tuple[str, ...]] | None = None  # those one cell's spec has (default: all)
    axes: Callable[[Any], dict[str, str]] = lambda spec: {}    # grid coordinates (tags) of its trials
    requirement_tags: Callable[[Any], dict[str, str]] = lambda spec: {}  # tags of its run when required by another
    # a sweep's plan of the trials its cells require: the plan's key for this kind's (``selectors``,
    # ``ear_trials``) and one row's fields besides name, key, cells and trained
    plan_group: str = ""
    plan_row: Callable[[Any], dict] = lambda spec: {}
    cell_tags: Callable[[Any], dict[str, str]] = lambda spec: {}         # a cell's run tags besides its axes
    grid: KindGrid | None = None                 # what a sweep's grid of this kind is (None: it has no sweeps)
    first_stages: tuple = ()                     # FirstStageMethods it serves (registered with the kind)
    miners: tuple = ()                           # MinerMethods (training_data.mining) it serves (registered with it)
    first_stages_of: Callable[[Any], list] = _no_first_stage  # (where, collection, split, FirstStageSpec) a trial reads
    # the estimate: (train, validation, test) pairs of a cell (spec, search, queries of a split); None: no estimate
    cell_pairs: Callable[[Any, Any, Callable[[str, str], int | None]], tuple] | None = None
    # --- h1-lifecycle's (one run_trial for every kind)
    title: str = "trial"                                        # how commands name one for people
    preflight: Callable[[Any], list[str]] = lambda spec: []     # what stops it before it computes (one line each)
    models: Callable[[Any], list[tuple[str, str]]] = _model_of  # (field, name) of each model it loads: `prepare` fetches each
    configuration_problems: Callable[[Any], list[str]] = lambda spec: []  # what in its file can never run: one line each
    kept_in: Callable[[Any], Path] | None = None                # where its result is kept
    report: Callable | None = None                              # what `orchestrate run` prints for a trial it reports itself

    def __post_init__(self) -> None:
        if not self.run_kind:
            object.__setattr__(self, "run_kind", self.name)
        if not self.described_as:
            object.__setattr__(self, "described_as", self.name)

    @property
    def keeps_result(self) -> bool:
        """Its result is kept outside the run store under an identity of its own and shared by every
        trial that reads it (a selector, an EAR trial): found there, not in the store."""
        return bool(self.result_file)

    def searched_names(self, spec) -> tuple[str, ...]:
        """The searched parameters one cell's spec has."""
        return self.searched_in(spec) if self.searched_in is not None else tuple(p.name for p in self.searched)

    def apply_params(self, spec, params: dict):
        """``spec`` with one sample of its cell's search space applied (each value where its
        declaration says), validated again."""
        declared = {p.name: p for p in self.searched}
        data = spec.model_dump(mode="json")
        for name, value in params.items():
            if name not in declared:
                raise ValueError(f"unknown searched parameter '{name}' of a {self.name} cell")
            parameter = declared[name]
            *sections, last = parameter.path
            target = data
            for section in sections:
                target = target[section]
            target[last] = parameter.convert(value) if parameter.convert is not None else value
        return self.spec.model_validate(data)


# ----------------------------------------------------------------------------- preflight
# Checks every kind's preflight shares: found offline, without preparing, one line each.


class Problems:
    """The lines that would stop a trial, in order, each once."""

    def __init__(self) -> None:
        self.lines: dict[str, None] = {}

    def add(self, line: str) -> None:
        self.lines[line] = None

    def check(self, call, *args, **kwargs) -> None:
        """``call(*args, **kwargs)``; the line of the :class:`InputError` it raises, if any."""
        try:
            call(*args, **kwargs)
        except InputError as exc:
            self.add(str(exc))

    def __iter__(self):
        return iter(self.lines)

    def list(self) -> list[str]:
        return list(self.lines)


def require_known_dataset(reference: str) -> None:
    """An ir_datasets id it knows (nothing is downloaded: loading an id reads its registry only)."""
    try:
        import ir_datasets

        ir_datasets.load(reference)
    except KeyError:
        raise InputError(reference, "unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, "
                                    "not an ir_datasets id") from None


def check_collections(problems: Problems, *references: str | None) -> None:
    """Each distinct collection is a local directory or an ir_datasets id."""
    for reference in dict.fromkeys(r for r in references if r):
        if local_directory(reference) is None:
            problems.check(require_known_dataset, reference)


def check_mining(problems: Problems, mining) -> None:
    """What would stop a ``training_data.mining`` miner (a missing checkpoint), as its method says."""
    if mining is not None and mining.method in MINERS:
        problems.check(MINERS[mining.method].preflight, mining)


# ----------------------------------------------------------------------------- report
# What ``orchestrate run`` shows of a trial whose kind reports its own result (an EAR trial:
# its test comparison), rather than the run store's table of validation and test measures.


@dataclass
class KindReport:
    """``fields``: the trial's JSON beside its name; ``heading``, a table of ``rows`` (label ->
    measures) and ``closing``: its text; ``comparison``: what a sweep's cell run keeps of it
    (``<kind>_comparison.json``), beside the trial file of its winner (``<kind>_trial.yaml``)."""

    fields: dict
    heading: str
    rows: list[tuple[str, dict[str, float]]]
    closing: list[str] = field(default_factory=list)
    comparison: dict = field(default_factory=dict)


__all__ = ["SELECTOR_DATA_TAG", "GridCell", "GridError", "KindGrid", "KindReport", "Problems", "SearchedParameter", "TrialKind",
           "check_collections", "require_known_dataset"]
