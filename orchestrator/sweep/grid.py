"""The sweep spec: a grid of cells, a hyper-parameter search per cell, and where the winners
are tested. A grid is of one trial kind, the base's (``base: {kind: ...}``; none: re-ranking),
and each kind declares its own (``TrialKind.grid``: its lists, its cells, their axes):

- re-ranking (``grid: {models, losses, augmentations, sizes, seeds}``): model x loss x
  augmentation x size x seed, plus a baseline cell per model, size and seed
  (:mod:`workloads.kinds.rerank.grid`);
- EAR (``base: {kind: ear, ...}``, ``grid: {models, rerankers, seeds}``): model x reranker x
  seed, each cell an EAR trial (:mod:`workloads.kinds.ear.grid`).

A cell is a fully specified trial except for the searched hyper-parameters; each trial of
a cell is the cell's trial spec with one sample of its search space applied. What a search
may set is generated from the kinds' declarations (``TrialKind.searched``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model, field_validator, model_validator

from orchestrator.core import schema
from orchestrator.core.config import check_kind_names, input_error, read_yaml, validate
from orchestrator.lifecycle.identity import trial_key
from orchestrator.lifecycle.targets import ZeroShot, target_overlap, targets
from workloads.core.errors import InputError
from workloads.kinds import DEFAULT_KIND, TRIAL_KINDS, GridCell, GridError, SearchedParameter, TrialKind, kind_of, requirements
from workloads.spec import FirstStageSpec

__all__ = ["Cell", "Choices", "FloatRange", "GridError", "LevelChoices", "SearchSpec", "SweepSpec", "ZeroShotTarget",
           "check_search", "expand_grid", "load_sweep", "sweep_specs"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloatRange(_Strict):
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("a log range needs low > 0")
        return self


class Choices(_Strict):
    choices: list[Any] = Field(min_length=1)


class LevelChoices(_Strict):
    """SIR level sizes to search (K per level, positive included): each choice a whole
    schedule, e.g. [[48, 16], [64, 16], [48, 24], [48, 16, 8]]; a cell samples those with as
    many levels as its own curriculum."""

    choices: list[list[int]] = Field(min_length=1)

    @model_validator(mode="after")
    def _shrinking(self) -> LevelChoices:
        checks = [p.check for kind in TRIAL_KINDS.values() for p in kind.searched if "levels" in p.spaces and p.check]
        for levels in self.choices:
            for check in checks:
                check(levels)  # the curriculum's own rule (shrinking, at least 2), as the kind declares it
        return self

    def for_levels(self, count: int) -> list[str]:
        """The choices with ``count`` levels, as Optuna categories ("48-16")."""
        return ["-".join(str(k) for k in levels) for levels in self.choices if len(levels) == count]


class _SearchSettings(_Strict):
    trials_per_cell: int = Field(default=4, ge=1)
    sampler_seed: int = 13
    objective: Literal[schema.OBJECTIVE] = schema.OBJECTIVE  # type: ignore[valid-type]  # the one objective
    max_concurrent_trials: int | None = Field(default=None, ge=1, description="default: as many as the cluster fits")
    # default wilcoxon, from benchmarks/pruning.py (docs/performance.md, "Median against Wilcoxon
    # pruning"): on a real SciFact grid it trained 0.66x the compute of no pruning against the
    # median pruner's 0.74x, and both kept every cell's winner
    pruner: Literal["none", "wilcoxon", "median", "hyperband"] = Field(
        default="wilcoxon", description="stop a trial that is worse than its cell's best trial so far, after an epoch: "
                                        "wilcoxon: on the validation queries, one by one (Optuna's WilcoxonPruner, a "
                                        "signed-rank test at wilcoxon_p); median: its validation nDCG@10 below the "
                                        "median of the cell's earlier trials at that epoch (MedianPruner); hyperband "
                                        "(HyperbandPruner); pruned trials are recorded, never retried")
    pruner_startup_trials: int = Field(default=2, ge=0, description="median: trials of a cell that run to the end "
                                                                     "before any is pruned")
    wilcoxon_p: float = Field(default=0.1, gt=0, lt=1, description="wilcoxon: prune when the trial is worse than the "
                                                                   "cell's best with a one-sided p below this")

    @model_validator(mode="after")
    def _read_by_the_pruner(self) -> _SearchSettings:
        """A pruner's setting given to another pruner has no effect: refused, not ignored (defaults pass,
        so a dumped spec validates again)."""
        fields = type(self).model_fields
        for name, reader in (("wilcoxon_p", "wilcoxon"), ("pruner_startup_trials", "median")):
            if self.pruner != reader and getattr(self, name) != fields[name].default:
                raise ValueError(f"{name} is the {reader} pruner's setting: it has no effect with pruner '{self.pruner}'")
        return self


# Every parameter a kind declares a sweep may search (``TrialKind.searched``, kinds in the
# registry's order, a name two kinds declare once): a new searched parameter joins the search space.
def _searched_declarations() -> dict[str, SearchedParameter]:
    found: dict[str, SearchedParameter] = {}
    for kind in TRIAL_KINDS.values():
        for parameter in kind.searched:
            first = found.setdefault(parameter.name, parameter)
            if not first.compatible(parameter):
                raise TypeError(f"searched parameter '{parameter.name}' is declared differently by two trial kinds")
    return found


SEARCHED = _searched_declarations()
_SPACES = {"range": FloatRange, "choices": Choices, "levels": LevelChoices}
_SearchedParameters = create_model(  # type: ignore[call-overload]
    "_SearchedParameters", __base__=_SearchSettings, __module__=__name__,
    **{name: (Union[tuple(_SPACES[space] for space in p.spaces)] | None,  # noqa: UP007 (a tuple of types)
              Field(default=None, alias=p.alias, description=p.description or None))
       for name, p in SEARCHED.items()})


class SearchSpec(_SearchedParameters):  # type: ignore[misc, valid-type]
    """The search settings and every searchable hyper-parameter (each set one applies to the cells that have it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ZeroShotTarget(_Strict):
    collection: str
    split: str = "test"
    first_stage: FirstStageSpec | None = Field(
        default=None, description="the target's own first stage (default: the trial's), e.g. bm25 for SciFact when the "
                                  "trial re-ranks WikiQA's given lists, given for WikiQA when it trains on BM25 candidates")

    @property
    def name(self) -> str:
        """The target's name: its metrics on a cell run are ``<name>_<measure>`` (``zs_<collection>_<split>``)."""
        return schema.zero_shot_target(self.collection, self.split)


class StorageSpec(_Strict):
    keep: Literal["winners", "all"] = Field(
        default="winners", description="winners: a trial keeps its chosen and its last epoch's checkpoints, and once a "
                                       "cell's winner is tested the other trials' checkpoints are deleted; all: every "
                                       "epoch of every trial is kept (about 1.3 GB per BERT-base epoch with its "
                                       "optimizer state)")
    log_models: bool = Field(default=True, description="log each cell winner's model (weights, tokenizer, no optimizer "
                                                        "state) to the MLflow artifact store, as the artifact 'model' of "
                                                        "the cell run")


def _an(words: str) -> str:
    return f"{'an' if words[:1].lower() in 'aeiou' else 'a'} {words}"


def _grid_kind(value: Any) -> TrialKind:
    """Which kind's grid a sweep's ``grid:`` is: the kind whose marker it lists (an EAR grid lists
    rerankers), else the default kind's."""
    kinds = [k for k in TRIAL_KINDS.values() if k.grid is not None]
    if isinstance(value, BaseModel):
        return next((k for k in kinds if isinstance(value, k.grid.spec)), TRIAL_KINDS[DEFAULT_KIND])
    marked = next((k for k in kinds if k.grid.marker is not None and isinstance(value, dict) and k.grid.marker in value), None)
    return marked or next(k for k in kinds if k.grid.marker is None)


class SweepSpec(_Strict):
    _source: tuple = PrivateAttr(default=())  # (file, YAML key path -> line) when loaded from a file
    _cells: list | None = PrivateAttr(default=None)  # the grid's cells, expanded once (by load_sweep or the first read)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any] = Field(description="trial fields shared by every cell: the trial spec of the base's kind "
                                             "(kind: its name; without kind: a re-ranking TrialSpec)")
    grid: Any = Field(description="the lists the cells are made of, of the base's kind (its KindGrid.spec)")
    search: SearchSpec = SearchSpec()
    zero_shot: list[ZeroShotTarget] = []
    max_failures: int = Field(default=1, ge=0, description="retries of a trial that raised")
    storage: StorageSpec = StorageSpec()

    @property
    def kind(self) -> TrialKind:
        """The trial kind of its cells."""
        return _grid_kind(self.grid)

    @property
    def cells(self) -> list[Cell]:
        """Every cell of the grid, expanded once and carried (:func:`expand_grid`, at load)."""
        if self._cells is None:
            self._cells = expand_grid(self)
        return self._cells

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> SweepSpec:
        copy = super().model_copy(update=update, deep=deep)
        copy._cells = None  # a copy may be another grid (updated, or changed in place): expanded again when read
        return copy

    @property
    def zero_shot_targets(self) -> list[ZeroShot]:
        """Where the winners are tested besides their own test data, as :func:`~orchestrator.lifecycle.targets.targets`
        reads them."""
        return [ZeroShot(t.collection, t.split, t.first_stage) for t in self.zero_shot]

    @field_validator("grid", mode="before")
    @classmethod
    def _kind_grid(cls, value: Any) -> Any:
        spec = _grid_kind(value).grid.spec
        return value if isinstance(value, spec) else spec.model_validate(value)

    @model_validator(mode="before")
    @classmethod
    def _grid_of_the_base_kind(cls, data: Any) -> Any:
        """The grid is of the base's kind, said before either grid's own fields are checked."""
        if not isinstance(data, dict) or not isinstance(data.get("base"), dict) or not isinstance(data.get("grid"), dict):
            return data
        base_kind, grid_kind = TRIAL_KINDS.get(data["base"].get("kind", DEFAULT_KIND)), _grid_kind(data["grid"])
        if base_kind is None or base_kind.grid is None or base_kind is grid_kind:
            return data  # (an unknown or grid-less kind: the cells' specs say what is wrong)
        if base_kind.grid.marker is not None:
            raise ValueError(f"{_an(base_kind.described_as)} sweep (base.kind: {base_kind.name}) has "
                             f"{_an(base_kind.described_as)} grid: {base_kind.grid.describe}")
        raise ValueError(f"grid.{grid_kind.grid.marker} makes {_an(grid_kind.described_as)} grid: set base.kind: "
                         f"{grid_kind.name} ({_an(grid_kind.described_as)} trial's fields in base)")

    @model_validator(mode="after")
    def _base_leaves_axes_to_grid(self) -> SweepSpec:
        self.kind.grid.check_base(self)
        return self


@dataclass(frozen=True)
class Cell(GridCell):
    """One grid cell: its axes, its trial spec (before search), and what can run it."""

    @property
    def searched(self) -> tuple[str, ...]:
        """The hyper-parameters searched in this cell (its kind's ``searched_in``)."""
        return () if self.spec is None else kind_of(self.spec).searched_names(self.spec)

    @property
    def requirements(self) -> list[str]:
        """The trial keys of the trials the cell requires first: the selector it augments with, the
        EAR trial whose run it re-ranks."""
        return [trial_key(r) for r in requirements([self.spec])] if self.spec is not None else []

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags of the cell's runs besides its axes (its kind's ``cell_tags``: which data
        trained a supervised selector)."""
        return {} if self.spec is None else kind_of(self.spec).cell_tags(self.spec)


def check_axis_values(sweep: SweepSpec) -> None:
    """The grid's value lists (models, sizes or rerankers, seeds) list each value once (a
    repeated value would be one cell twice)."""
    for axis in sweep.kind.grid.axis_values:
        values = getattr(sweep.grid, axis)
        for i, value in enumerate(values):
            if value in values[:i]:
                raise GridError(f"grid.{axis} lists {value!r} twice", [(axis, values.index(value)), (axis, i)])


def expand_grid(sweep: SweepSpec) -> list[Cell]:
    """Every cell of the grid, as its kind expands it (re-ranking: baselines first for each
    (model, size, seed))."""
    check_axis_values(sweep)
    return [Cell(c.key, c.axes, c.spec, c.unavailable, c.is_baseline) for c in sweep.kind.grid.expand(sweep)]


def _search_values(space) -> list:
    if isinstance(space, FloatRange):
        return [space.low, space.high]
    if isinstance(space, Choices):
        return list(space.choices)
    return []  # LevelChoices: checked by its own validator


def distinct_parameter_sets(cell: Cell, search: SearchSpec) -> int | None:
    """How many distinct parameter sets a cell's search can draw (None: unbounded, a range)."""
    count = 1
    for name in cell.searched:
        space = getattr(search, name)
        if space is None:
            continue
        if isinstance(space, FloatRange):
            return None
        count *= len(space.choices) if isinstance(space, Choices) else len(space.for_levels(len(cell.spec.sir.levels)))
    return count


def check_search(sweep: SweepSpec, cells: list[Cell]) -> tuple[tuple, str] | None:
    """The first problem of the search against the cells, as (YAML key path, message), or None:
    a range or choice outside what the field accepts, or a cell that cannot draw
    ``trials_per_cell`` distinct parameter sets (its trials would repeat one another)."""
    runnable = [c for c in cells if c.spec is not None]
    own = {p.name for p in sweep.kind.searched}
    for name in SearchSpec.model_fields:
        space = getattr(sweep.search, name)
        cell = next((c for c in runnable if name in c.searched), None)
        if space is not None and name in SEARCHED and name not in own:
            # a space of another kind's cells would silently search nothing (a re-ranking space
            # may name a loss's parameter that only some grids have: that one applies when present)
            shown = SearchSpec.model_fields[name].alias or name
            owners = " and ".join(k.described_as for k in TRIAL_KINDS.values() if name in {p.name for p in k.searched})
            return ("search", shown), (f"search.{shown}: only {owners} cells search it, and this grid's cells are "
                                       f"{sweep.kind.described_as} trials: remove it")
        if cell is None or not isinstance(space, (FloatRange, Choices)):
            continue
        shown = SearchSpec.model_fields[name].alias or name
        for value in _search_values(space):
            try:
                kind_of(cell.spec).apply_params(cell.spec, {name: value})
            except ValidationError as exc:
                problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
                return ("search", shown), f"search.{shown}: {value!r} is not a value {shown} can take ({problem})"
            except (TypeError, ValueError) as exc:
                return ("search", shown), f"search.{shown}: {value!r} is not a value {shown} can take ({exc})"
    for cell in runnable:
        distinct = distinct_parameter_sets(cell, sweep.search)
        if distinct is not None and distinct < sweep.search.trials_per_cell:
            searched = ", ".join(n.removesuffix("_") for n in cell.searched if getattr(sweep.search, n) is not None) or "nothing"
            return (("search", "trials_per_cell"),
                    f"search.trials_per_cell {sweep.search.trials_per_cell}: cell {'/'.join(cell.axes.values())} can draw "
                    f"only {distinct} distinct parameter set(s) ({searched} searched): its trials would repeat one another")
    return None


def load_sweep(path: Path, command: str = "sweep") -> SweepSpec:
    """A sweep file, validated with every cell's trial spec (the base is checked through them)
    and its search against the cells; errors name the file and the line. A trial file is
    refused as one (``command``: the command that was given it, named in the message)."""
    path = Path(path)
    data, lines = read_yaml(path)
    if "grid" not in data and ("trials" in data or "base" not in data):
        raise InputError(path, f"a trial file, not a sweep file (it has no grid): `orchestrate {command}` takes a sweep "
                               "file (name, base, grid, search); `orchestrate run` runs a trial file")
    check_kind_names(data, path, lines)
    sweep = validate(data, SweepSpec, path, lines)
    try:
        cells = sweep.cells
    except GridError as exc:
        where = [lines.get(("grid", axis, index)) for axis, index in exc.entries]
        shown = " and ".join(str(line) for line in where if line is not None)
        raise InputError(f"{path}:{where[-1]}" if where[-1] else path, f"{exc}" + (f" (lines {shown})" if shown else "")) from None
    except ValidationError as exc:
        raise input_error(exc, path, lines, under=("base",)) from None
    problem = check_search(sweep, cells)
    if problem is not None:
        key, message = problem
        line = lines.get(key) or lines.get(("search",))
        raise InputError(f"{path}:{line}" if line else path, message)
    sweep._source = (path, lines)
    check_targets(sweep, cells, query_ids=False)
    return sweep


def sweep_file(sweep: SweepSpec) -> Path | None:
    return Path(sweep._source[0]).resolve() if sweep._source else None


def check_owner(sweep: SweepSpec, recorded: str | None, where: str, homes: tuple[Path, Path] | None = None) -> bool:
    """Whether the store of this sweep's name belongs to this sweep's file. Another file that
    still exists owns it: one line, naming both. A recorded file that no longer exists (moved
    or renamed) is taken over (returns True: record the new one). ``homes``: where the store
    was when ``recorded`` was written, and where it is now; a store moved or copied since (an
    rsync, ``cp -r`` of the project folder) belongs to the file at the same place beside it, the
    original file elsewhere says nothing about the copy that is read."""
    mine = sweep_file(sweep)
    if mine is None or recorded is None or Path(recorded) == mine:
        return recorded is None and mine is not None
    if homes is not None and Path(homes[0]) != Path(homes[1]) and \
            os.path.relpath(recorded, homes[0]) == os.path.relpath(mine, homes[1]):
        logging.getLogger("rerank_lab.sweep").debug("sweep %s: %s was moved or copied from %s; it belongs to %s beside it",
                                                   sweep.name, where, homes[0], mine)
        return True
    if Path(recorded).exists():
        raise InputError(mine, f"sweep name '{sweep.name}' is already used in {where} by {recorded}: two sweep files of "
                               "one name would share cells, trials and reports; rename one (name:) or use another "
                               "--storage / --tracking-uri")
    logging.getLogger("rerank_lab.sweep").info("sweep %s: its file moved from %s to %s; the store follows it", sweep.name,
                                              recorded, mine)
    return True


def yaml_location(sweep: SweepSpec, *keys: tuple) -> str:
    """``FILE:LINE`` of the first of ``keys`` found in the sweep's YAML (``FILE`` alone, or the
    sweep's name, when the sweep did not come from a file)."""
    if not sweep._source:
        return sweep.name
    path, lines = sweep._source
    line = next((lines[k] for k in keys if k in lines), None)
    return f"{path}:{line}" if line else str(path)


def check_targets(sweep: SweepSpec, cells: list[Cell], query_ids: bool = True) -> None:
    """Every evaluation target (the test data, its perturbed copies, each zero-shot collection)
    is held out from the training and validation queries: by configuration, and with
    ``query_ids`` by the queries of local collections (nothing is prepared). A target that is
    not is an error naming its YAML line."""
    cell = next((c for c in cells if c.spec is not None), None)
    if cell is None or not sweep.kind.grid.zero_shot:  # (EAR carves validation from train; no zero-shot)
        return
    zero_shot = sweep.zero_shot_targets
    evaluation_targets = targets(cell.spec, zero_shot)
    own = len(evaluation_targets) - len(zero_shot)
    for index, target in enumerate(evaluation_targets):
        problem = target_overlap(cell.spec, target, query_ids)
        if problem is None:
            continue
        keys = ((("zero_shot", index - own),) if index >= own else
                (("base", "data", "test_split"), ("base", "data", "test_collection"), ("base", "data")))
        raise InputError(yaml_location(sweep, *keys), problem + ": a test must be held out (choose another split or collection)")


def sweep_specs(sweep) -> list:
    """Every trial spec a sweep's runnable cells and their zero-shot targets prepare."""
    cells = [c.spec for c in sweep.cells if c.spec is not None]
    if not cells or not sweep.kind.grid.zero_shot:  # (its winners are tested on their own test split only)
        return cells
    return cells + [target.spec for target in targets(cells[0], sweep.zero_shot_targets)[1:]]
