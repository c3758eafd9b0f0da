"""The EAR trial: its typed spec, its identity, where a trained one is kept.

An EAR trial (``kind: ear`` in a trial file) expands every query of its splits, labels each
expansion with the rank BM25 gives the query's first relevant document when searching with
it, and trains a cross-encoder to choose, without labels, the expansion BM25 will do best
with (:mod:`workloads.kinds.ear.train`). Its kept result, in ``<cache>/ear/<key>/``
(:func:`ear_dir`), is the TREC run of the chosen expansions of its train, validation and test
queries: a re-ranking trial with ``first_stage: {method: ear, run: <this file>}`` re-ranks
what EAR retrieved (:mod:`workloads.kinds.ear.first_stage`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.core.paths import cache_dir, stable_key
from workloads.spec import DataSpec, ExpansionSpec, ModelSpec, ResourcesSpec, load_trial_file
from workloads.text.sentences import SPLITTER_VERSION

COMPLETE_MARKER = "ear_result.json"  # written last: a directory without it is not a trained EAR trial
RUN_FILE = "run.trec"                # the chosen expansions' BM25 rankings, every query of the trial's splits
RERANKERS = ("ri", "rd")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EarSpec(_Strict):
    """The query reranker and how it is trained (EAR, section 3.3)."""

    reranker: Literal[RERANKERS] = Field(  # type: ignore[valid-type]
        default="ri", description="ri: M(q, e), the query and the expansion; rd: M(q, e, d), also the top-1 document "
                                  "that BM25 retrieves with q + e")
    alpha: float = Field(default=0.05, gt=0, description="the margin per rank of difference: a pair (i, j) with r_i < r_j "
                                                         "costs max(0, M_i - M_j + (r_j - r_i) * alpha)")
    max_rank: int = Field(default=101, ge=2, description="the label of an expansion whose top `depth` has no relevant "
                                                         "document (MAX_RANK; above depth)")
    depth: int = Field(default=100, ge=1, le=1000, description="BM25's top-k per expanded query: the labels' window and "
                                                               "the depth of the chosen expansion's run")
    learning_rate: float = Field(default=2e-5, gt=0, lt=1)
    epochs: int = Field(default=3, ge=1)
    queries_per_step: int = Field(default=2, ge=1, description="queries per step, each with all its n expansions")
    warmup_steps: int = Field(default=50, ge=0, description="linear warm-up, then constant")
    patience: int | None = Field(default=None, ge=1, description="epochs without a better validation nDCG@10 before "
                                                                 "stopping (none: every epoch)")
    eval_batch_size: int = Field(default=64, ge=1)

    @model_validator(mode="after")
    def _labels(self) -> EarSpec:
        if self.max_rank <= self.depth:
            raise ValueError(f"max_rank ({self.max_rank}) labels expansions that find nothing in the top depth "
                             f"({self.depth}): it must be above depth")
        return self


class EarBM25(_Strict):
    """BM25 as every expanded query is searched (EAR's retriever)."""

    k1: float = Field(default=0.9, gt=0)
    b: float = Field(default=0.4, ge=0, le=1)


class EarTrialSpec(_Strict):
    kind: Literal["ear"] = Field(default="ear", description="what the file is: an EAR trial (a re-ranking trial has no kind)")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 13
    data: DataSpec
    bm25: EarBM25 = EarBM25()
    expansion: ExpansionSpec = ExpansionSpec()
    ear: EarSpec = EarSpec()
    model: ModelSpec
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    resources: ResourcesSpec = ResourcesSpec()

    @model_validator(mode="after")
    def _plain_test(self) -> EarTrialSpec:
        if self.data.test_perturbation is not None or self.data.test_first_stage is not None:
            raise ValueError("an EAR trial retrieves its test queries itself: data.test_perturbation and "
                             "data.test_first_stage belong to re-ranking trials")
        if self.data.test_collection not in (None, self.data.collection):
            raise ValueError("an EAR trial tests on its own collection (its run serves that collection's trials): for "
                             "another collection, `orchestrate expand --dataset ... --ear <this file>` tests it zero-shot")
        return self


def ear_key(spec: EarTrialSpec) -> str:
    """What changes the kept result: everything but the name, the resources and the scoring
    batch, and the content of an expansions file (or a local generator) changed in place."""
    from workloads.kinds.ear.sources import source_content  # noqa: PLC0415  (lazy: a spec loads without torch)

    payload = spec.model_dump_json(exclude={"name": True, "resources": True, "ear": {"eval_batch_size"}})
    return stable_key(payload, source_content(spec.expansion), f"sentences-v{SPLITTER_VERSION}")


def ear_axes(spec: EarTrialSpec) -> dict[str, str]:
    """An EAR trial's grid coordinates, named as a re-ranking trial's so that status, reports
    and MLflow read both alike: ``loss`` is ``ear-ri`` or ``ear-rd`` (EAR's rank loss over that
    reranker's inputs), ``augmentation`` its expansion source (what is added to each query),
    ``size`` ``full`` (it trains on every training query with a choice to learn)."""
    return {"model": spec.model.name, "loss": f"ear-{spec.ear.reranker}", "augmentation": spec.expansion.source,
            "size": "full", "seed": str(spec.seed), "collection": spec.data.collection}


def ear_requirement_tags(spec: EarTrialSpec) -> dict[str, str]:
    """An EAR trial's tags when a re-ranking trial requires it: the axes they share, its
    expansions and its reranker."""
    return {"model": spec.model.name, "seed": str(spec.seed), "collection": spec.data.collection,
            "expansion": f"{spec.expansion.source}-{spec.expansion.n}", "reranker": spec.ear.reranker}


def ear_dir(spec: EarTrialSpec) -> Path:
    return cache_dir() / "ear" / f"{spec.ear.reranker}-{ear_key(spec)}"


def trained_ear(spec: EarTrialSpec) -> Path | None:
    """The kept result's directory, or None when the trial has not finished."""
    path = ear_dir(spec)
    return path if (path / COMPLETE_MARKER).exists() else None


def is_ear_file(data: object) -> bool:
    """A trial file's top level says it holds EAR trials (one, or ``base`` of several)."""
    if not isinstance(data, dict):
        return False
    base = data.get("base")
    return data.get("kind") == "ear" or (isinstance(base, dict) and base.get("kind") == "ear")


def load_ear_trial(path: str) -> EarTrialSpec:
    """The EAR trial of a one-trial file (a re-ranking trial's ``first_stage.run``), one line on error."""
    return load_trial_file(path, EarTrialSpec, "ear", "an EAR", said_as="first_stage run: ")


__all__ = ["COMPLETE_MARKER", "RUN_FILE", "EarSpec", "EarTrialSpec", "ear_axes", "ear_dir", "ear_key", "ear_requirement_tags",
           "is_ear_file",
           "load_ear_trial", "trained_ear"]
