"""The sweep spec: a grid of cells (model x loss x augmentation x size x seed, plus a
baseline cell per model, size and seed), a hyper-parameter search per cell, and where the
winners are tested.

A cell is a fully specified trial except for the searched hyper-parameters; each trial of
a cell is the cell's trial spec with one sample of its search space applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core import schema
from workloads.augmentation.scorers import SCORERS
from workloads.losses import searchable_parameters
from workloads.paths import stable_key
from workloads.spec import FirstStageSpec, LossSpec, RankingName, SelectorSpec, SIRSpec, TrialSpec


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


class SearchSpec(_Strict):
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
    lambda_: FloatRange | Choices | None = Field(default=None, alias="lambda")
    tau: FloatRange | Choices | None = None
    contrastive_margin: FloatRange | Choices | None = None
    margin: FloatRange | Choices | None = Field(default=None, description="hinge margin of pairwise and mhl")
    nca_scale: FloatRange | Choices | None = Field(default=None, description="s of RankingNCA")
    k: Choices | None = Field(default=None, description="k_a, the sentences an augmenter keeps")
    sir_levels: LevelChoices | None = Field(default=None, description="SIR's K per level (cells with a curriculum)")

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


class SweepSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base: dict[str, Any] = Field(description="trial fields shared by every cell (see TrialSpec)")
    grid: GridSpec
    search: SearchSpec = SearchSpec()
    zero_shot: list[ZeroShotTarget] = []
    max_failures: int = Field(default=1, ge=0, description="retries of a trial that raised")

    @model_validator(mode="after")
    def _base_leaves_axes_to_grid(self) -> SweepSpec:
        for key in ("name", "model", "loss", "augmentation", "sir"):
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
    spec: TrialSpec | None
    unavailable: str | None  # why no workload can run this cell yet, else None
    is_baseline: bool

    @property
    def searched(self) -> tuple[str, ...]:
        """The hyper-parameters searched in this cell."""
        if self.spec is None:
            return ()
        names = ["learning_rate", *searchable_parameters(self.spec.loss)]
        if self.spec.augmentation.method != "none":
            names.append("k")
        if self.spec.sir is not None and self.spec.sir.variant != "v0":
            names.append("sir_levels")
        return tuple(names)


def _cell_axes(model: str, loss: LossCell, augmentation: AugmentationCell, size, seed: int) -> dict[str, str]:
    """The cell's grid coordinates: the same values as ``schema.axes`` of its trials."""
    return {"model": model, "loss": schema.loss_label(loss.loss_spec()) + schema.sir_label(loss.sir),
            "augmentation": augmentation.method, "size": str(size), "seed": str(seed)}


def expand_grid(sweep: SweepSpec) -> list[Cell]:
    """Every cell of the grid, baselines first for each (model, size, seed)."""
    cells: list[Cell] = []
    grid = sweep.grid
    baseline_loss = LossCell(ranking=grid.baseline_ranking)
    no_augmentation = AugmentationCell()
    for model in grid.models:
        for size in grid.sizes:
            for seed in grid.seeds:
                combos = [(baseline_loss, no_augmentation, True)]
                combos += [(loss, aug, False) for loss in grid.losses for aug in grid.augmentations
                           if not (loss == baseline_loss and aug == no_augmentation)]
                for loss, augmentation, is_baseline in combos:
                    cells.append(_make_cell(sweep, model, loss, augmentation, size, seed, is_baseline))
    return cells


def _make_cell(sweep: SweepSpec, model: str, loss: LossCell, augmentation: AugmentationCell, size, seed: int,
               is_baseline: bool) -> Cell:
    axes = _cell_axes(model, loss, augmentation, size, seed)
    key = "cell-" + stable_key(sweep.name, sorted(axes.items()))
    if loss.contrastive == "infonce" and augmentation.method == "none":
        return Cell(key, axes, None, "infonce needs augmentation", is_baseline)
    trial = dict(sweep.base)
    trial.update({
        "name": f"{sweep.name}.{key}",
        "seed": seed,
        "model": {"name": model, "max_length": sweep.grid.max_length},
        "loss": loss.loss_spec().model_dump(exclude_defaults=True, by_alias=True),
        "augmentation": augmentation.model_dump(exclude_defaults=True, exclude_none=True) if augmentation.method != "none" else {},
        "training_data": {**(sweep.base.get("training_data") or {}), "size": size, "seed": seed},
    })
    if loss.sir is not None:
        trial["sir"] = loss.sir.model_dump()
    return Cell(key, axes, TrialSpec.model_validate(trial), None, is_baseline)


def load_sweep(path: Path) -> SweepSpec:
    """A sweep file, validated with every cell's trial spec (the base is checked through them);
    errors name the file and the line."""
    from pydantic import ValidationError

    from orchestrator.core.config import input_error, read_yaml, validate

    data, lines = read_yaml(Path(path))
    sweep = validate(data, SweepSpec, Path(path), lines)
    try:
        expand_grid(sweep)
    except ValidationError as exc:
        raise input_error(exc, Path(path), lines, under=("base",)) from None
    return sweep
