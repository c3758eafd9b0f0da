"""The interface every loss follows (after sentence-transformers' cross-encoder losses).

``forward(outputs, structure)`` takes the model's outputs (scores and Phi) and the batch's
structure, and returns a scalar. ``config`` holds the hyper-parameters (logged with runs).
A batch in which a loss has nothing to compare (e.g. no negative for any positive) gives a
zero that keeps the graph, and is counted in ``degenerate_batches``; never NaN.

Each loss declares its hyper-parameters once, in ``hyperparameters`` (the ``LossSpec`` field
-> the constructor argument) and ``searchable`` (the fields a sweep may search): spec
validation, construction and the sweep's search space all read these declarations (the
``SUPPORTED_PARAMS`` idea of ir_measures).

Counters that change training (a step counter, degenerate batches) are part of the
module's ``state_dict`` (``get_extra_state``), so a resumed trial continues exactly where
the checkpoint left it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from workloads.batches import PairStructure


@dataclass
class ModelOutputs:
    scores: torch.Tensor  # [B]
    phi: torch.Tensor     # [B, H]


class PairLoss(nn.Module):
    name: ClassVar[str] = ""
    hyperparameters: ClassVar[dict[str, str]] = {}  # LossSpec field -> constructor argument
    searchable: ClassVar[tuple[str, ...]] = ()      # LossSpec fields a sweep may search
    needs_hidden_size: ClassVar[bool] = False       # the constructor takes the encoder's hidden size

    def __init__(self) -> None:
        super().__init__()
        self.degenerate_batches = 0
        # The named parts of the last value, for logging (a combined loss: ranking, contrastive).
        self.last_parts: dict[str, float] = {}

    @property
    def config(self) -> dict[str, float | str]:
        return {}

    def forward(self, outputs: ModelOutputs, structure: PairStructure) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _nothing_to_compare(self, outputs: ModelOutputs) -> torch.Tensor:
        self.degenerate_batches += 1
        # A zero that keeps the graph, through the loss's own parameters too: data-parallel
        # training expects a gradient (here 0) for every parameter in every step.
        zero = (outputs.scores.sum() + outputs.phi.sum()) * 0.0
        for parameter in self.parameters():
            zero = zero + parameter.sum() * 0.0
        return zero

    def get_extra_state(self) -> dict:
        return {"degenerate_batches": self.degenerate_batches}

    def set_extra_state(self, state: dict) -> None:
        self.degenerate_batches = int(state.get("degenerate_batches", 0))


class MarginPairLoss(PairLoss):
    """A loss whose one hyper-parameter is a margin (hinge, centroid triplet, triplet margin)."""

    default_margin: ClassVar[float] = 1.0

    def __init__(self, margin: float | None = None) -> None:
        super().__init__()
        self.margin = self.default_margin if margin is None else margin

    @property
    def config(self) -> dict[str, float | str]:
        return {"margin": self.margin}
