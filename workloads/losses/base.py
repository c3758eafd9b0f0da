"""The interface every loss follows (after sentence-transformers' cross-encoder losses).

``forward(outputs, structure)`` takes the model's outputs (scores and Phi) and the batch's
structure, and returns a scalar. ``config`` holds the hyper-parameters (logged with runs).
A batch in which a loss has nothing to compare (e.g. no negative for any positive) gives a
zero that keeps the graph, and is counted in ``degenerate_batches``; never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workloads.batches import PairStructure


@dataclass
class ModelOutputs:
    scores: torch.Tensor  # [B]
    phi: torch.Tensor     # [B, H]


class PairLoss(nn.Module):
    name: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.degenerate_batches = 0

    @property
    def config(self) -> dict[str, float]:
        return {}

    def forward(self, outputs: ModelOutputs, structure: PairStructure) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _nothing_to_compare(self, outputs: ModelOutputs) -> torch.Tensor:
        self.degenerate_batches += 1
        return (outputs.scores.sum() + outputs.phi.sum()) * 0.0  # zero that keeps the graph


class MarginPairLoss(PairLoss):
    """A loss whose one hyper-parameter is a margin (hinge, centroid triplet, triplet margin)."""

    default_margin: float = 1.0

    def __init__(self, margin: float | None = None) -> None:
        super().__init__()
        self.margin = self.default_margin if margin is None else margin

    @property
    def config(self) -> dict[str, float]:
        return {"margin": self.margin}
