"""``augmentation`` of a re-ranking trial: which sentence scorer augments each triple, and how."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads.kinds.rerank.augmentation.scorers import SCORERS, SUPERVISED_METHODS
from workloads.kinds.rerank.augmentation.supervised import SelectorSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


AugmentationMethod = Literal[("none", *SCORERS)]  # type: ignore[valid-type]  # the scorer registry's names


class AugmentationSpec(_Strict):
    """AUG Algorithm 1: each (q, d+, d-) gains (q, d+_a, d-_a); the batch doubles."""

    method: AugmentationMethod = "none"
    k: int = Field(default=3, ge=1, description="k_a: sentences kept from d+, ordered by score")
    seed: int = 13
    glove_path: str | None = Field(
        default=None, description="GloVe text file (.txt or .txt.gz); relative paths resolve against $ORCHESTRATE_DATA_DIR")
    redraw: Literal["epoch", "once"] = Field(
        default="epoch",
        description="epoch: d-_a (and the random scorer's sentences) drawn anew every epoch, seeded (AUG Algorithm 1 "
                    "draws per batch); once: one draw for all epochs")

    selector: SelectorSpec | None = Field(
        default=None, description="linear/attention: the selector and its training (defaults when left out)")

    @model_validator(mode="before")
    @classmethod
    def _supervised_default(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("method") in SUPERVISED_METHODS and data.get("selector") is None:
            return {**data, "selector": {}}
        return data

    @model_validator(mode="after")
    def _glove_needs_vectors(self) -> AugmentationSpec:
        if self.selector is not None and self.method not in SUPERVISED_METHODS:
            raise ValueError(f"selector has no effect with method '{self.method}' (only {', '.join(SUPERVISED_METHODS)})")
        if self.method == "glove" and not self.glove_path:
            raise ValueError("method 'glove' needs glove_path (e.g. glove/glove.6B.50d.top100k.txt.gz)")
        if self.method != "glove" and self.glove_path:
            raise ValueError(f"glove_path has no effect with method '{self.method}'")
        return self
