"""The dense kind's sweep grid (``base: {kind: dense, ...}``, ``grid: {models, objectives,
negatives, seeds}``): model x objective x negatives x seed, each cell a dense trial of ``base``
whose search draws the learning rate and the temperature, and, in a diffcse cell, lambda and
the masking ratio (the kind's ``searched``; :func:`searched_in`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads.kinds.dense.spec import NEGATIVES, OBJECTIVES, RTD_PARAMETERS, SEARCHED_PARAMETERS, DenseTrialSpec
from workloads.kinds.protocol import GridCell, KindGrid


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DenseGridSpec(_Strict):
    """A dense grid: every (model, objective, negatives, seed) is a cell, a dense trial of ``base``."""

    models: list[str] = Field(min_length=1)
    objectives: list[Literal[OBJECTIVES]] = Field(  # type: ignore[valid-type]
        min_length=1, description="contrastive: DPR (SimCSE when unsupervised); diffcse: plus conditional RTD")
    negatives: list[Literal[NEGATIVES]] = Field(  # type: ignore[valid-type]
        default=["bm25"], min_length=1, description="bm25: BM25 hard negatives and in-batch ones; in_batch: in-batch only")
    seeds: list[int] = Field(default=[13], min_length=1)
    max_length: int = Field(default=256, ge=16, description="document tokens of every model")
    query_max_length: int = Field(default=64, ge=8, description="query tokens of every model")


def dense_axes(spec: DenseTrialSpec) -> dict[str, str]:
    """A dense trial's grid coordinates, named as a re-ranking trial's (status, reports and MLflow
    read every kind alike): ``loss`` its objective (``dpr``, ``simcse``, ``diffcse-dpr``,
    ``diffcse-simcse``), ``augmentation`` its negatives, ``size`` its training pairs."""
    base = "simcse" if spec.dense.unsupervised else "dpr"
    loss = base if spec.dense.objective == "contrastive" else f"diffcse-{base}"
    negatives = "bm25" if spec.dense.hard_negatives else "in_batch"
    return {"model": spec.model.name, "loss": loss, "augmentation": f"{negatives}-negatives",
            "size": str(spec.training_data.size), "seed": str(spec.seed), "collection": spec.data.collection}


def searched_in(spec: DenseTrialSpec) -> tuple[str, ...]:
    """The searched parameters a cell reads: lambda and the masking ratio only where RTD trains."""
    names = tuple(p.field for p in SEARCHED_PARAMETERS)
    return names if spec.dense.objective == "diffcse" else tuple(n for n in names if n not in RTD_PARAMETERS)


def expand_grid(sweep) -> list[GridCell]:
    grid, cells = sweep.grid, []
    dense = sweep.base.get("dense")
    dense = dense if isinstance(dense, dict) else {} if dense is None else dense  # not a mapping: the spec says so
    for model in grid.models:
        for objective in grid.objectives:
            for negatives in grid.negatives:
                for seed in grid.seeds:
                    settings = {**dense, "objective": objective, "negatives": negatives} if isinstance(dense, dict) else dense
                    if objective != "diffcse" and isinstance(settings, dict):  # base's RTD settings are the diffcse cells'
                        settings = {k: v for k, v in settings.items() if k not in (*RTD_PARAMETERS, "generator", "rtd_average")}
                    trial = {**sweep.base, "name": sweep.name, "seed": seed, "dense": settings,
                             "model": {"name": model, "max_length": grid.max_length,
                                       "query_max_length": grid.query_max_length}}
                    spec = DenseTrialSpec.model_validate(trial)
                    cells.append(GridCell.of(sweep.name, spec, dense_axes(spec)))
    return cells


def check_base(sweep) -> None:
    """A dense sweep's base is a dense trial's fields less what the grid sets."""
    for key in ("name", "model", "seed"):
        if key in sweep.base:
            raise ValueError(f"base.{key} is set by the grid; remove it from base")
    dense = sweep.base.get("dense")
    for key in ("objective", "negatives"):
        if isinstance(dense, dict) and key in dense:
            raise ValueError(f"base.dense.{key} is set by the grid; remove it from base")


DENSE_GRID = KindGrid(spec=DenseGridSpec, expand=expand_grid, check_base=check_base,
                      axis_values=("models", "objectives", "negatives", "seeds"), marker="objectives",
                      describe="models, objectives (contrastive, diffcse), negatives (bm25, in_batch) and seeds")

__all__ = ["DENSE_GRID", "DenseGridSpec", "dense_axes", "expand_grid", "searched_in"]
