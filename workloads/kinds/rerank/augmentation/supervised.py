"""Supervised augmentation (AUG's ``linear`` and ``attention``): a selector's settings
(``augmentation.selector`` of a re-ranking trial, :class:`SelectorSpec`), and what the selector
trial kind serves the re-ranking trials that augment with one (:class:`TrainedSelectors`,
registered by :mod:`workloads.kinds.selector.kind`): the selector trial a trial requires,
where it is kept, and the trained model that scores sentences. The re-ranking kind asks this
registry, never the selector's package, so the selector kind (which prepares its data as a
re-ranking trial does) depends on this one and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SelectorSpec(_Strict):
    """A supervised sentence selector (AUG eq. 8-16) and how it is trained (select-and-rank,
    Leonhardt et al.). Defaults are the reference implementation's; ``k`` must stay well
    below a document's sentence count."""

    k: int = Field(default=20, ge=1, description="sentences the selector picks for the ranker while it trains (relaxed top-k)")
    tau: float = Field(default=1.0, gt=0, description="temperature of the relaxed top-k")
    data: Literal["cell", "full"] = Field(
        default="cell", description="cell: the same N pairs as the ranker (fair for sample-efficiency claims); full: every "
                                    "training query (AUG's likely choice; leaks more labels into small cells)")
    embeddings: Literal["model", "glove"] = Field(
        default="model", description="model: the ranker's word-piece input embeddings, shared and trained; glove: a GloVe file")
    glove_path: str | None = Field(default=None, description="GloVe text file for embeddings: glove")
    glove_trainable: bool = False
    dimension: int = Field(default=256, ge=1, description="linear: output of the affine map; attention: LSTM units per direction")
    dropout: float = Field(default=0.1, ge=0, lt=1)
    loss: Literal["pointwise", "pairwise"] = Field(default="pointwise", description="pointwise BCE, or the pairwise hinge")
    margin: float = Field(default=0.2, gt=0, description="pairwise hinge margin")
    learning_rate: float = Field(default=3e-5, gt=0, lt=1)
    selector_learning_rate: float | None = Field(
        default=None, gt=0, lt=1, description="the selector's own parameters (trained from scratch; the shared embeddings "
                                              "follow learning_rate); default: learning_rate, as the reference")
    warmup_steps: int = Field(default=1_000, ge=0, description="linear warm-up, then constant")
    batch_size: int = Field(default=16, ge=2, description="pairs per step (whole triples: even)")
    epochs: int = Field(default=50, ge=1, description="at most; early stopping on validation")
    patience: int = Field(default=3, ge=1, description="epochs without a better validation nDCG@10 before stopping")
    max_sentences: int = Field(default=500, ge=1)
    max_document_tokens: int = Field(default=5_000, ge=1)
    max_query_tokens: int = Field(default=50, ge=1)
    eval_batch_size: int = Field(default=32, ge=1)

    @model_validator(mode="after")
    def _coherent(self) -> SelectorSpec:
        if self.embeddings == "glove" and not self.glove_path:
            raise ValueError("embeddings 'glove' needs glove_path (e.g. glove/glove.6B.50d.top100k.txt.gz)")
        if self.embeddings != "glove" and (self.glove_path or self.glove_trainable):
            raise ValueError("glove_path and glove_trainable need embeddings: glove")
        if self.loss != "pairwise" and self.margin != 0.2:
            raise ValueError("margin has no effect with loss 'pointwise'")
        if self.batch_size % 2:
            raise ValueError(f"batch_size holds whole (positive, negative) triples: must be even, got {self.batch_size}")
        return self


@dataclass(frozen=True)
class TrainedSelectors:
    """What the selector kind serves: ``trial(spec)`` the selector trial a re-ranking trial that
    augments with a supervised method requires; ``trained(selector)`` its kept directory, or
    None; ``kept_in(selector)`` where it is (to be) kept; ``load(directory)`` the trained model
    (``score_sentences(query, sentences)``)."""

    trial: Callable[[Any], Any]
    trained: Callable[[Any], Path | None]
    kept_in: Callable[[Any], Path]
    load: Callable[[Path], Any]


_SERVED: list[TrainedSelectors] = []


def serve_selectors(served: TrainedSelectors) -> None:
    """Register the selector kind's service (``workloads.kinds.selector.kind`` does, once)."""
    _SERVED[:] = [served]


def trained_selectors() -> TrainedSelectors:
    """The selector kind's service (registered when ``workloads.kinds`` is imported, as it is
    before any kind's module runs)."""
    if not _SERVED:
        raise RuntimeError("no selector kind is registered (import workloads.kinds)")
    return _SERVED[0]
