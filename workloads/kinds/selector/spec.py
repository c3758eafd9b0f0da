"""The selector trial: its own typed spec, derived from the trial that augments with it.

A selector's identity (:func:`selector_key`) is what changes the trained selector: its
training set (collection, splits, first stage, size, seed), the method, its spec and the
embeddings (the ranker model it shares them with). Test settings are left out: a selector
tested elsewhere is the same selector. Trained selectors live in
``<cache>/selectors/<key>/`` (:func:`selector_dir`), shared by every trial that needs one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workloads.core.paths import cache_dir, stable_key
from workloads.kinds.protocol import SELECTOR_DATA_TAG
from workloads.kinds.rerank.augmentation.supervised import SelectorSpec
from workloads.kinds.rerank.spec import OptimizationSpec, TrialSpec
from workloads.kinds.selector import SELECTORS
from workloads.spec import DataSpec, FirstStageSpec, ModelSpec, ResourcesSpec, TrainingDataSpec
from workloads.text.sentences import SPLITTER_VERSION

SELECTOR_METHODS = tuple(SELECTORS)  # the selector registry's names
COMPLETE_MARKER = "selector_result.json"  # written last: a directory without it is not a trained selector


class SelectorTrialSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    method: Literal[SELECTOR_METHODS]  # type: ignore[valid-type]
    seed: int = 13
    data: DataSpec
    first_stage: FirstStageSpec = FirstStageSpec()
    training_data: TrainingDataSpec = TrainingDataSpec()
    model: ModelSpec
    selector: SelectorSpec = SelectorSpec()
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    resources: ResourcesSpec = ResourcesSpec()

    def as_rerank_trial(self) -> TrialSpec:
        """The plain re-ranking trial with the same data: its preparation is the selector's."""
        return TrialSpec(name=self.name, seed=self.seed, data=self.data, first_stage=self.first_stage,
                         training_data=self.training_data, model=self.model,
                         optimization=OptimizationSpec(precision=self.precision, eval_batch_size=self.selector.eval_batch_size),
                         resources=self.resources)


def selector_trial(spec: TrialSpec) -> SelectorTrialSpec:
    """The selector a trial augmenting with ``linear`` or ``attention`` needs."""
    method = spec.augmentation.method
    if method not in SELECTOR_METHODS or spec.augmentation.selector is None:
        raise ValueError(f"{spec.name}: augmentation '{method}' trains no selector")
    selector = spec.augmentation.selector
    size = spec.training_data.size if selector.data == "cell" else "full"
    draft = SelectorTrialSpec(name="selector", method=method, seed=spec.seed, data=spec.data, first_stage=spec.first_stage,
                              training_data=spec.training_data.model_copy(update={"size": size}), model=spec.model,
                              selector=selector, precision=spec.optimization.precision, resources=spec.resources)
    return draft.model_copy(update={"name": f"selector-{method}-{selector_key(draft)[:8]}"})


def selector_key(spec: SelectorTrialSpec) -> str:
    # first_stage.path left out while unset, index while build: they came after selectors were first keyed
    # (rm3's fields, a kind's trial file in run: came later too)
    first_stage = {"test_depth"} | spec.first_stage.unread_fields()
    training_data = {"negatives"} if spec.training_data.negatives == 1 else set()
    training_data |= {"queries"} if spec.training_data.queries == "all" else set()  # (came later too)
    data = {"test_collection", "test_split", "test_perturbation", "test_first_stage"}
    data |= {"validation_cap"} if spec.data.validation_cap is None else set()  # added after selectors were first keyed
    exclude = {"name": True, "resources": True, "data": data, "first_stage": first_stage, "training_data": training_data}
    return stable_key(spec.model_dump_json(exclude=exclude), f"sentences-v{SPLITTER_VERSION}")


def selector_requirement_tags(spec: SelectorTrialSpec) -> dict[str, str]:
    """A selector's tags: the axes it shares with the trials that use it, and which training data it saw."""
    return {"model": spec.model.name, "seed": str(spec.seed), "collection": spec.data.collection,
            "augmentation": spec.method, "size": str(spec.training_data.size), SELECTOR_DATA_TAG: spec.selector.data}


def selector_dir(spec: SelectorTrialSpec) -> Path:
    return cache_dir() / "selectors" / f"{spec.method}-{selector_key(spec)}"


def trained_selector(spec: SelectorTrialSpec) -> Path | None:
    """The trained selector's directory, or None when it is not (completely) trained."""
    path = selector_dir(spec)
    return path if (path / COMPLETE_MARKER).exists() else None
