"""The EAR kind's sweep grid (``base: {kind: ear, ...}``, ``grid: {models, rerankers, seeds}``):
model x reranker x seed, each cell an EAR trial of ``base`` whose search draws alpha,
MAX_RANK, n and the learning rate (:data:`workloads.kinds.ear.spec.KIND`'s ``searched``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads.kinds.ear.spec import RERANKERS, EarTrialSpec, ear_axes
from workloads.kinds.protocol import GridCell, KindGrid


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EarGridSpec(_Strict):
    """An EAR grid: every (model, reranker, seed) is a cell, an EAR trial of ``base``."""

    models: list[str] = Field(min_length=1)
    rerankers: list[Literal[RERANKERS]] = Field(min_length=1, description="ri: M(q, e); rd: M(q, e, d)")  # type: ignore[valid-type]
    seeds: list[int] = Field(default=[13], min_length=1)
    max_length: int = Field(default=256, ge=16, description="input tokens of every model (RD reads the document too)")


def expand_grid(sweep) -> list[GridCell]:
    """Every (model, reranker, seed) of an EAR grid, its axes named as a re-ranking grid's
    (:func:`ear_axes`: ``loss`` is ``ear-ri`` or ``ear-rd``)."""
    grid, cells = sweep.grid, []
    ear = sweep.base.get("ear")  # not a mapping: EarTrialSpec says so, naming base.ear
    for model in grid.models:
        for reranker in grid.rerankers:
            for seed in grid.seeds:
                trial = {**sweep.base, "name": sweep.name, "seed": seed, "model": {"name": model, "max_length": grid.max_length},
                         "ear": {**ear, "reranker": reranker} if isinstance(ear, dict) else
                                {"reranker": reranker} if ear is None else ear}
                spec = EarTrialSpec.model_validate(trial)
                cells.append(GridCell.of(sweep.name, spec, ear_axes(spec)))
    return cells


def check_base(sweep) -> None:
    """An EAR sweep's base is an EAR trial's fields (EarTrialSpec says which are unknown) less
    what the grid sets; its winners are tested on their own test split only."""
    for key in ("name", "model", "seed"):
        if key in sweep.base:
            raise ValueError(f"base.{key} is set by the grid; remove it from base")
    ear = sweep.base.get("ear")
    if isinstance(ear, dict) and "reranker" in ear:
        raise ValueError("base.ear.reranker is set by the grid (rerankers); remove it from base")
    if sweep.zero_shot:
        raise ValueError("an EAR sweep tests each winner on its own test split; test a kept EAR trial zero-shot "
                         "with `orchestrate expand --ear FILE`")


def shape(grid: EarGridSpec) -> str:
    return (f"EAR trials: {len(grid.models)} model(s) x {len(grid.rerankers)} reranker(s) ({', '.join(grid.rerankers)}; "
            f"the `loss` axis: ear-ri, ear-rd) x {len(grid.seeds)} seed(s), each winner kept.")


EAR_GRID = KindGrid(spec=EarGridSpec, expand=expand_grid, check_base=check_base, axis_values=("models", "rerankers", "seeds"),
                    marker="rerankers", describe="models, rerankers (ri, rd) and seeds", zero_shot=False, shape=shape)
