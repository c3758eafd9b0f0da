"""The re-ranking kind's sweep grid: model x loss x augmentation x size x seed, plus a baseline
cell per model, size and seed (``grid: {models, losses, augmentations, sizes, seeds}``).

Each cell is a re-ranking trial spec before search; a loss or augmentation entry alone under
its name keeps its plain label (the loss axis: ``workloads.kinds.rerank.identity.loss_label``),
so a grid that gains no look-alike keeps its cell keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.core.paths import stable_key
from workloads.kinds.protocol import GridCell, GridError, KindGrid
from workloads.kinds.rerank.augmentation.scorers import SCORERS
from workloads.kinds.rerank.augmentation.supervised import SelectorSpec
from workloads.kinds.rerank.identity import loss_label as loss_axis_label
from workloads.kinds.rerank.identity import sir_label
from workloads.kinds.rerank.spec import LossSpec, RankingName, SIRSpec, TrialSpec
from workloads.losses import needs_augmentation, searchable_parameters


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


def searched_fields(search, axis: str, entry) -> set[str]:
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
        return loss_axis_label(entry.loss_spec()) + sir_label(entry.sir)
    full = entry.selector is not None and entry.selector.data == "full"
    return entry.method + ("[full]" if full else "")


def entry_labels(sweep, axis: str) -> list[str]:
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


def _cell_axes(model: str, loss_label: str, augmentation_label: str, size, seed: int) -> dict[str, str]:
    """The cell's grid coordinates: the same values as ``schema.axes`` of its trials."""
    return {"model": model, "loss": loss_label, "augmentation": augmentation_label, "size": str(size), "seed": str(seed)}


def expand_grid(sweep) -> list[GridCell]:
    """Every cell of a re-ranking grid, baselines first for each (model, size, seed)."""
    loss_labels, augmentation_labels = entry_labels(sweep, "losses"), entry_labels(sweep, "augmentations")
    cells: list[GridCell] = []
    seen: set[str] = set()
    grid = sweep.grid
    baseline_loss = LossCell(ranking=grid.baseline_ranking)
    baseline_label = loss_axis_label(baseline_loss.loss_spec())
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


def _make_cell(sweep, axes: dict[str, str], loss: LossCell, augmentation: AugmentationCell,
               is_baseline: bool) -> GridCell:
    key = "cell-" + stable_key(sweep.name, sorted(axes.items()))
    seed = int(axes["seed"])
    size = axes["size"] if axes["size"] == "full" else int(axes["size"])
    if needs_augmentation(loss.loss_spec()) and augmentation.method == "none":
        return GridCell(key, axes, None, f"{loss.contrastive} needs augmentation", is_baseline)
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
    return GridCell(key, axes, TrialSpec.model_validate(trial), None, is_baseline)


def check_base(sweep) -> None:
    """A re-ranking sweep's base leaves the grid's axes to the grid."""
    for key in ("name", "model", "loss", "augmentation", "sir", "seed"):
        if key in sweep.base:
            raise ValueError(f"base.{key} is set by the grid; remove it from base")
    grid_owned = set(sweep.base.get("training_data") or {}) & {"size", "seed"}
    if grid_owned:
        raise ValueError(f"base.training_data.{sorted(grid_owned)[0]} is set by the grid (sizes, seeds); remove it from base")


def shape(grid: GridSpec) -> str:
    return (f"{len(grid.models)} model(s) x {len(grid.losses)} loss(es) x {len(grid.augmentations)} augmentation(s) x "
            f"{len(grid.sizes)} size(s) x {len(grid.seeds)} seed(s), plus a baseline per model, size and seed.")


RERANK_GRID = KindGrid(spec=GridSpec, expand=expand_grid, check_base=check_base, axis_values=("models", "sizes", "seeds"),
                       describe="models, losses, augmentations, sizes and seeds", shape=shape)
