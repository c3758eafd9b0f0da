"""The sweep spec: a grid of cells, a hyper-parameter search per cell, and where the winners
are tested. A grid is of one trial kind:

- re-ranking (``grid: {models, losses, augmentations, sizes, seeds}``): model x loss x
  augmentation x size x seed, plus a baseline cell per model, size and seed;
- EAR (``base: {kind: ear, ...}``, ``grid: {models, rerankers, seeds}``): model x reranker x
  seed, each cell an EAR trial whose search draws alpha, MAX_RANK, n and the learning rate.

A cell is a fully specified trial except for the searched hyper-parameters; each trial of
a cell is the cell's trial spec with one sample of its search space applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, create_model, model_validator

from orchestrator.core import schema
from workloads.augmentation.scorers import SCORERS
from workloads.errors import InputError
from workloads.expansion.kind import RERANKERS, EarTrialSpec
from workloads.losses import PARAMETERS, needs_augmentation, searchable_parameters
from workloads.paths import stable_key
from workloads.spec import LOSS_HYPERPARAMETERS, FirstStageSpec, LossSpec, RankingName, SelectorSpec, SIRSpec, TrialSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LossCell(LossSpec):
    """A grid's loss entry: a (partial) LossSpec, its names and the settings that are not
    searched (e.g. {ranking: pointwise, contrastive: tml, tml_reduction: nonzero}; searched
    ones come from `search`), and optionally the SIR curriculum that applies it (its label
    joins the loss axis; a grid whose baseline ranking is `sir` has V0 as its baseline)."""

    sir: SIRSpec | None = None

    def loss_spec(self) -> LossSpec:
        return LossSpec.model_validate(self.model_dump(exclude={"sir"}, by_alias=True))


class AugmentationCell(_Strict):
    method: Literal[("none", *SCORERS)] = "none"  # type: ignore[valid-type]
    k: int = Field(default=3, ge=1)
    glove_path: str | None = None
    selector: SelectorSpec | None = Field(default=None, description="linear/attention: the selector and its training")


class GridSpec(_Strict):
    models: list[str] = Field(min_length=1)
    losses: list[LossCell] = Field(min_length=1)
    augmentations: list[AugmentationCell] = Field(min_length=1)
    sizes: list[int | Literal["full"]] = Field(min_length=1)
    seeds: list[int] = Field(default=[13], min_length=1)
    max_length: int = Field(default=512, ge=16, description="input tokens of every model")
    baseline_ranking: RankingName = "pointwise"

    @model_validator(mode="after")
    def _v0_is_the_baseline(self) -> GridSpec:
        if any(loss.sir is not None and loss.sir.variant == "v0" for loss in self.losses):
            raise ValueError("sir v0 (same blocks and loss, no compression) is the baseline cell: set baseline_ranking "
                             "to the level loss (sir or listwise) and leave v0 out of losses")
        return self


class EarGridSpec(_Strict):
    """An EAR grid: every (model, reranker, seed) is a cell, an EAR trial of ``base``."""

    models: list[str] = Field(min_length=1)
    rerankers: list[Literal[RERANKERS]] = Field(min_length=1, description="ri: M(q, e); rd: M(q, e, d)")  # type: ignore[valid-type]
    seeds: list[int] = Field(default=[13], min_length=1)
    max_length: int = Field(default=256, ge=16, description="input tokens of every model (RD reads the document too)")


def _grid_kind(value: Any) -> str:
    """Which grid a sweep's ``grid:`` is: an EAR grid lists rerankers."""
    return "ear" if isinstance(value, EarGridSpec) or (isinstance(value, dict) and "rerankers" in value) else "rerank"


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
        for levels in self.choices:
            SIRSpec(variant="v3", levels=levels)  # the curriculum's own rule (shrinking, at least 2)
        return self

    def for_levels(self, count: int) -> list[str]:
        """The choices with ``count`` levels, as Optuna categories ("48-16")."""
        return ["-".join(str(k) for k in levels) for levels in self.choices if len(levels) == count]


class _SearchSettings(_Strict):
    trials_per_cell: int = Field(default=4, ge=1)
    sampler_seed: int = 13
    objective: Literal[schema.OBJECTIVE] = schema.OBJECTIVE  # type: ignore[valid-type]  # the one objective
    max_concurrent_trials: int | None = Field(default=None, ge=1, description="default: as many as the cluster fits")
    # default median after two start-up trials, from benchmarks/sweep_cost.py (README "Performance"):
    # every cell kept its best at 0.87x the compute; with one start-up trial a cell lost its best
    pruner: Literal["none", "median", "hyperband"] = Field(
        default="median", description="stop a trial whose validation nDCG@10 after an epoch is below what the cell's "
                                      "earlier trials had reached by then (Optuna's MedianPruner or HyperbandPruner); "
                                      "only against trials of the same cell; pruned trials are recorded, never retried")
    pruner_startup_trials: int = Field(default=2, ge=0, description="median: trials of a cell that run to the end "
                                                                     "before any is pruned")
    # Searched hyper-parameters; each applies only to cells whose loss or augmentation has it
    # (tau only for scl/infonce, k only with augmentation, ...).
    learning_rate: FloatRange | Choices | None = None


# Every loss hyper-parameter a loss declares searchable (``workloads.losses``, in LossSpec's
# order), generated from the declarations: a new searchable parameter joins the search space.
_SearchedLossParameters = create_model(  # type: ignore[call-overload]
    "_SearchedLossParameters", __base__=_SearchSettings, __module__=__name__,
    **{field: (FloatRange | Choices | None, Field(default=None, alias=PARAMETERS[field].alias,
                                                  description=PARAMETERS[field].description))
       for field in LOSS_HYPERPARAMETERS if PARAMETERS[field].searchable})


class SearchSpec(_SearchedLossParameters):  # type: ignore[misc, valid-type]
    """The search settings and every searchable hyper-parameter (each set one applies to the cells that have it)."""

    k: Choices | None = Field(default=None, description="k_a, the sentences an augmenter keeps")
    sir_levels: LevelChoices | None = Field(default=None, description="SIR's K per level (cells with a curriculum)")
    alpha: FloatRange | Choices | None = Field(default=None, description="EAR: the margin per rank of difference")
    max_rank: Choices | None = Field(default=None, description="EAR: the label of an expansion that finds nothing "
                                                               "(each above ear.depth)")
    n: Choices | None = Field(default=None, description="EAR: expansions per query (each a prepared set of its own)")

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


class SweepSpec(_Strict):
    _source: tuple = PrivateAttr(default=())  # (file, YAML key path -> line) when loaded from a file

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any] = Field(description="trial fields shared by every cell (see TrialSpec; EarTrialSpec with "
                                             "kind: ear)")
    grid: Annotated[Annotated[GridSpec, Tag("rerank")] | Annotated[EarGridSpec, Tag("ear")], Discriminator(_grid_kind)]
    search: SearchSpec = SearchSpec()
    zero_shot: list[ZeroShotTarget] = []
    max_failures: int = Field(default=1, ge=0, description="retries of a trial that raised")
    storage: StorageSpec = StorageSpec()

    @property
    def is_ear(self) -> bool:
        return isinstance(self.grid, EarGridSpec)

    @model_validator(mode="before")
    @classmethod
    def _grid_of_the_base_kind(cls, data: Any) -> Any:
        """The grid is of the base's kind, said before either grid's own fields are checked."""
        if not isinstance(data, dict) or not isinstance(data.get("base"), dict) or not isinstance(data.get("grid"), dict):
            return data
        ear_base, ear_grid = data["base"].get("kind") == "ear", "rerankers" in data["grid"]
        if ear_base and not ear_grid:
            raise ValueError("an EAR sweep (base.kind: ear) has an EAR grid: models, rerankers (ri, rd) and seeds")
        if ear_grid and not ear_base:
            raise ValueError("grid.rerankers makes an EAR grid: set base.kind: ear (an EAR trial's fields in base)")
        return data

    @model_validator(mode="after")
    def _base_leaves_axes_to_grid(self) -> SweepSpec:
        if self.is_ear:  # the base is an EAR trial's fields (EarTrialSpec says which are unknown)
            for key in ("name", "model", "seed"):
                if key in self.base:
                    raise ValueError(f"base.{key} is set by the grid; remove it from base")
            ear = self.base.get("ear")
            if isinstance(ear, dict) and "reranker" in ear:
                raise ValueError("base.ear.reranker is set by the grid (rerankers); remove it from base")
            if self.zero_shot:
                raise ValueError("an EAR sweep tests each winner on its own test split; test a kept EAR trial zero-shot "
                                 "with `orchestrate expand --ear FILE`")
            return self
        for key in ("name", "model", "loss", "augmentation", "sir", "seed"):
            if key in self.base:
                raise ValueError(f"base.{key} is set by the grid; remove it from base")
        grid_owned = set(self.base.get("training_data") or {}) & {"size", "seed"}
        if grid_owned:
            raise ValueError(f"base.training_data.{sorted(grid_owned)[0]} is set by the grid (sizes, seeds); remove it from base")
        return self


@dataclass(frozen=True)
class Cell:
    """One grid cell: its axes, its trial spec (before search), and what can run it."""

    key: str
    axes: dict[str, str]
    spec: TrialSpec | EarTrialSpec | None
    unavailable: str | None  # why no workload can run this cell yet, else None
    is_baseline: bool

    @property
    def searched(self) -> tuple[str, ...]:
        """The hyper-parameters searched in this cell."""
        if self.spec is None:
            return ()
        if isinstance(self.spec, EarTrialSpec):
            return tuple(EAR_SEARCHED)
        names = ["learning_rate", *searchable_parameters(self.spec.loss)]
        if self.spec.augmentation.method != "none":
            names.append("k")
        if self.spec.sir is not None and self.spec.sir.variant != "v0":
            names.append("sir_levels")
        return tuple(names)

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags of the cell's runs besides its axes: which data trained a supervised selector
        (``full`` leaks every training query's labels into the cell: the method asks to say so)."""
        selector = self.spec.augmentation.selector if isinstance(self.spec, TrialSpec) else None
        return {schema.SELECTOR_DATA_TAG: selector.data} if selector is not None else {}


class GridError(ValueError):
    """A grid whose entries would collapse into one cell: ``entries`` are the (axis, index) pairs involved."""

    def __init__(self, message: str, entries: list[tuple[str, int]]):
        super().__init__(message)
        self.entries = entries


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_flatten(inner, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def _setting_label(field: str, value: Any) -> str:
    """How one distinguishing setting shows in a label: ``k=1``, ``full``, ``glove=<file>``."""
    if field == "selector.data":
        return str(value)
    if field.endswith("glove_path") and isinstance(value, str):
        return f"{field.replace('_path', '')}={Path(value).name}"
    return f"{field.removesuffix('_')}={value}"


def searched_fields(search: SearchSpec, axis: str, entry) -> set[str]:
    """The fields of a grid entry a sweep's search sets in every cell made from it (the entry's
    own value is then never used)."""
    if axis == "augmentations":
        return {"k"} if entry.method != "none" and search.k is not None else set()
    names = {n for n in searchable_parameters(entry.loss_spec()) if getattr(search, n) is not None}
    if entry.sir is not None and entry.sir.variant != "v0" and search.sir_levels is not None:
        names.add("sir.levels")
    return names


def _base_label(axis: str, entry) -> str:
    if axis == "losses":
        return schema.loss_label(entry.loss_spec()) + schema.sir_label(entry.sir)
    full = entry.selector is not None and entry.selector.data == "full"
    return entry.method + ("[full]" if full else "")


def entry_labels(sweep: SweepSpec, axis: str) -> list[str]:
    """The label of every entry of ``grid.<axis>`` (losses or augmentations): its name, plus the
    settings that tell it apart from other entries of the same name (``bm25[k=1]``,
    ``pointwise+scl[tau=0.2]``). An entry alone under its name keeps its plain name, so a grid
    that gains no look-alike keeps its cell keys. Raises :class:`GridError` for two entries
    that would be one cell: identical, or differing only in what the search sets."""
    entries = getattr(sweep.grid, axis)
    bases = [_base_label(axis, e) for e in entries]
    labels = list(bases)
    for base in dict.fromkeys(bases):
        members = [i for i, b in enumerate(bases) if b == base]
        if len(members) == 1:
            continue
        settings = {}
        for i in members:
            flat = _flatten(entries[i].model_dump(mode="json", by_alias=True))
            settings[i] = {k: v for k, v in flat.items() if k not in searched_fields(sweep.search, axis, entries[i])}
        keys = sorted({k for i in members for k in settings[i]})
        differing = [k for k in keys if len({repr(settings[i].get(k)) for i in members}) > 1]
        for position, i in enumerate(members):
            twin = next((j for j in members[:position] if settings[j] == settings[i]), None)
            if twin is not None:
                searched = sorted(searched_fields(sweep.search, axis, entries[i]))
                how = (f"identical apart from {', '.join(searched)}, which the search sets" if searched and
                       _flatten(entries[i].model_dump(mode="json", by_alias=True)) !=
                       _flatten(entries[twin].model_dump(mode="json", by_alias=True)) else "identical")
                raise GridError(f"grid.{axis} entries {twin + 1} and {i + 1} are {how}: they would be one cell "
                                f"(remove one)", [(axis, twin), (axis, i)])
            shown = [_setting_label(k, settings[i].get(k)) for k in differing if settings[i].get(k) is not None]
            labels[i] = f"{base}[{','.join(shown)}]" if shown else base
    return labels


def check_axis_values(sweep: SweepSpec) -> None:
    """models, sizes (rerankers) and seeds list each value once (a repeated value would be one cell twice)."""
    for axis in ("models", "rerankers", "seeds") if sweep.is_ear else ("models", "sizes", "seeds"):
        values = getattr(sweep.grid, axis)
        for i, value in enumerate(values):
            if value in values[:i]:
                raise GridError(f"grid.{axis} lists {value!r} twice", [(axis, values.index(value)), (axis, i)])


def _cell_axes(model: str, loss_label: str, augmentation_label: str, size, seed: int) -> dict[str, str]:
    """The cell's grid coordinates: the same values as ``schema.axes`` of its trials."""
    return {"model": model, "loss": loss_label, "augmentation": augmentation_label, "size": str(size), "seed": str(seed)}


def expand_grid(sweep: SweepSpec) -> list[Cell]:
    """Every cell of the grid, baselines first for each (model, size, seed)."""
    check_axis_values(sweep)
    if sweep.is_ear:
        return _expand_ear_grid(sweep)
    loss_labels, augmentation_labels = entry_labels(sweep, "losses"), entry_labels(sweep, "augmentations")
    cells: list[Cell] = []
    seen: set[str] = set()
    grid = sweep.grid
    baseline_loss = LossCell(ranking=grid.baseline_ranking)
    baseline_label = schema.loss_label(baseline_loss.loss_spec())
    no_augmentation = AugmentationCell()
    for model in grid.models:
        for size in grid.sizes:
            for seed in grid.seeds:
                combos = [(baseline_loss, baseline_label, no_augmentation, "none", True)]
                combos += [(loss, loss_label, aug, aug_label, False)
                           for loss, loss_label in zip(grid.losses, loss_labels)
                           for aug, aug_label in zip(grid.augmentations, augmentation_labels)
                           if not (loss == baseline_loss and aug == no_augmentation)]
                for loss, loss_label, augmentation, augmentation_label, is_baseline in combos:
                    axes = _cell_axes(model, loss_label, augmentation_label, size, seed)
                    cell = _make_cell(sweep, axes, loss, augmentation, is_baseline)
                    if cell.key not in seen:  # e.g. {method: none, k: 2} beside the baseline: the same cell once
                        seen.add(cell.key)
                        cells.append(cell)
    return cells


def _make_cell(sweep: SweepSpec, axes: dict[str, str], loss: LossCell, augmentation: AugmentationCell,
               is_baseline: bool) -> Cell:
    key = "cell-" + stable_key(sweep.name, sorted(axes.items()))
    seed = int(axes["seed"])
    size = axes["size"] if axes["size"] == "full" else int(axes["size"])
    if needs_augmentation(loss.loss_spec()) and augmentation.method == "none":
        return Cell(key, axes, None, f"{loss.contrastive} needs augmentation", is_baseline)
    trial = dict(sweep.base)
    trial.update({
        "name": f"{sweep.name}.{key}",
        "seed": seed,
        "model": {"name": axes["model"], "max_length": sweep.grid.max_length},
        "loss": loss.loss_spec().model_dump(exclude_defaults=True, by_alias=True),
        "augmentation": augmentation.model_dump(exclude_defaults=True, exclude_none=True) if augmentation.method != "none" else {},
        "training_data": {**(sweep.base.get("training_data") or {}), "size": size, "seed": seed},
    })
    if loss.sir is not None:
        trial["sir"] = loss.sir.model_dump()
    return Cell(key, axes, TrialSpec.model_validate(trial), None, is_baseline)


# An EAR cell's searched hyper-parameters: where each sits in its trial spec.
EAR_SEARCHED = {"learning_rate": ("ear", "learning_rate"), "alpha": ("ear", "alpha"), "max_rank": ("ear", "max_rank"),
                "n": ("expansion", "n")}


def _expand_ear_grid(sweep: SweepSpec) -> list[Cell]:
    """Every (model, reranker, seed) of an EAR grid, its axes named as a re-ranking grid's
    (:func:`orchestrator.core.schema.axes`: ``loss`` is ``ear-ri`` or ``ear-rd``)."""
    grid, cells = sweep.grid, []
    ear = sweep.base.get("ear")  # not a mapping: EarTrialSpec says so, naming base.ear
    for model in grid.models:
        for reranker in grid.rerankers:
            for seed in grid.seeds:
                trial = {**sweep.base, "name": sweep.name, "seed": seed, "model": {"name": model, "max_length": grid.max_length},
                         "ear": {**ear, "reranker": reranker} if isinstance(ear, dict) else
                                {"reranker": reranker} if ear is None else ear}
                spec = EarTrialSpec.model_validate(trial)
                axes = {axis: value for axis, value in schema.axes(spec).items() if axis in schema.GRID_AXES}
                key = "cell-" + stable_key(sweep.name, sorted(axes.items()))
                cells.append(Cell(key, axes, spec.model_copy(update={"name": f"{sweep.name}.{key}"}), None, False))
    return cells


def apply_params(spec: TrialSpec | EarTrialSpec, params: dict) -> TrialSpec | EarTrialSpec:
    """The cell's spec with one sample of its search space applied."""
    data = spec.model_dump(mode="json")
    if isinstance(spec, EarTrialSpec):
        for name, value in params.items():
            if name not in EAR_SEARCHED:
                raise ValueError(f"unknown searched parameter '{name}' of an EAR cell")
            section, field = EAR_SEARCHED[name]
            data[section][field] = value
        return EarTrialSpec.model_validate(data)
    for name, value in params.items():
        if name == "learning_rate":
            data["optimization"]["learning_rate"] = value
        elif name in LOSS_HYPERPARAMETERS:
            data["loss"][name] = value
        elif name == "k":
            data["augmentation"]["k"] = value
        elif name == "sir_levels":
            data["sir"]["levels"] = [int(k) for k in str(value).split("-")]
        else:
            raise ValueError(f"unknown searched parameter '{name}'")
    return TrialSpec.model_validate(data)


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
    from pydantic import ValidationError

    runnable = [c for c in cells if c.spec is not None]
    for name in SearchSpec.model_fields:
        space = getattr(sweep.search, name)
        cell = next((c for c in runnable if name in c.searched), None)
        if space is not None and name in _KIND_SPACES and (name in EAR_SEARCHED) != sweep.is_ear:
            # a space of the other kind's cells would silently search nothing (a re-ranking space
            # may name a loss's parameter that only some grids have: that one applies when present)
            shown = SearchSpec.model_fields[name].alias or name
            return ("search", shown), (f"search.{shown}: {'only EAR' if name in EAR_SEARCHED else 'only re-ranking'} "
                                       f"cells search it, and this grid's cells are {'EAR' if sweep.is_ear else 're-ranking'}"
                                       " trials: remove it")
        if cell is None or not isinstance(space, (FloatRange, Choices)):
            continue
        shown = SearchSpec.model_fields[name].alias or name
        for value in _search_values(space):
            try:
                apply_params(cell.spec, {name: value})
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


# the searched spaces only one kind's cells have (the settings and learning_rate apply to all)
_KIND_SPACES = frozenset(set(SearchSpec.model_fields) - set(_SearchSettings.model_fields))


def load_sweep(path: Path) -> SweepSpec:
    """A sweep file, validated with every cell's trial spec (the base is checked through them)
    and its search against the cells; errors name the file and the line."""
    from pydantic import ValidationError

    from orchestrator.core.config import input_error, read_yaml, validate

    path = Path(path)
    data, lines = read_yaml(path)
    sweep = validate(data, SweepSpec, path, lines)
    try:
        cells = expand_grid(sweep)
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
    import os

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
    from orchestrator.core.lifecycle import target_overlap, targets

    cell = next((c for c in cells if c.spec is not None), None)
    if cell is None or isinstance(cell.spec, EarTrialSpec):  # EAR carves validation from train; no zero-shot
        return
    zero_shot = [(t.collection, t.split, t.first_stage) for t in sweep.zero_shot]
    evaluation_targets = targets(cell.spec, zero_shot)
    own = len(evaluation_targets) - len(zero_shot)
    for index, target in enumerate(evaluation_targets):
        problem = target_overlap(cell.spec, target, query_ids)
        if problem is None:
            continue
        keys = ((("zero_shot", index - own),) if index >= own else
                (("base", "data", "test_split"), ("base", "data", "test_collection"), ("base", "data")))
        raise InputError(yaml_location(sweep, *keys), problem + ": a test must be held out (choose another split or collection)")
