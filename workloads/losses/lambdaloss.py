"""LambdaLoss with the NDCG-Loss2++ weighting (Wang et al., 2018, "The LambdaLoss Framework
for Ranking Metric Optimization"), over the blocks of ``workloads.losses.listwise``: one
positive and its negatives (a ``per_query`` batch row, or a triple).

Within a block the documents are ranked by their scores (ties in block order, the positive
first); r is a document's rank (1 = the top) and D(r) = log2(1 + r) its discount. With one
relevant document the gains are G = 1 for the positive and 0 for a negative (the ideal DCG
is 1). Every (positive, negative) pair contributes

    l = -w log2 sigmoid(sigma (s+ - s-)),
    w = mu |1/D(|r+ - r-|) - 1/D(|r+ - r-| + 1)| + |1/D(r+) - 1/D(r-)|,

NDCG-Loss2's weight (the paper's delta_ij) times mu plus LambdaRank's, both times
|G+ - G-| = 1. The weights follow the current ranking and carry no gradient. A block's loss
is the mean over its pairs, the batch's the mean over its blocks (for blocks of one size the
mean over all pairs, as sentence-transformers' cross-encoder ``LambdaLoss``, whose defaults
sigma = 1, mu = 10 and base-2 logarithm these are; the log-sigmoid is computed directly
rather than from clamped probabilities, so a badly misordered pair keeps its gradient). A
block without a negative compares nothing (a batch of only such blocks is degenerate).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from workloads.losses.base import ModelOutputs, PairLoss, Parameter
from workloads.losses.listwise import blocks

SIGMA = Parameter(field="lambdaloss_sigma", argument="sigma", annotation=float, default=1.0, gt=0, searchable=True,
                  description="lambdaloss: sigma in sigmoid(sigma (s+ - s-)), the scale of score differences")
MU = Parameter(field="lambdaloss_mu", argument="mu", annotation=float, default=10.0, ge=0,
               description="lambdaloss: mu of NDCG-Loss2++, the weight of NDCG-Loss2's term beside LambdaRank's")


def _inverse_discount(rank: torch.Tensor) -> torch.Tensor:
    return 1.0 / torch.log2(1.0 + rank)


def pair_weights(scores: torch.Tensor, mu: float) -> torch.Tensor:
    """NDCG-Loss2++ weights of a block's (positive, negative) pairs, the positive at index 0."""
    order = torch.sort(scores.detach(), descending=True, stable=True).indices
    rank = torch.empty(len(scores), dtype=torch.float64, device=scores.device)
    rank[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64, device=scores.device)
    positive, negatives = rank[0], rank[1:]
    distance = (positive - negatives).abs()
    ndcg_loss2 = (_inverse_discount(distance) - _inverse_discount(distance + 1)).abs()
    lambda_rank = (_inverse_discount(positive) - _inverse_discount(negatives)).abs()
    return mu * ndcg_loss2 + lambda_rank


class LambdaLoss(PairLoss):
    """LambdaLoss, NDCG-Loss2++ weighting, over each block (see the module's docstring).

    Args:
        sigma: the scale of score differences in the sigmoid.
        mu: the weight of NDCG-Loss2's term beside LambdaRank's.
    """

    name = "lambdaloss"
    declared_parameters = (SIGMA, MU)

    def __init__(self, sigma: float = 1.0, mu: float = 10.0) -> None:
        super().__init__()
        self.sigma, self.mu = sigma, mu

    @property
    def config(self) -> dict[str, float | str]:
        return {"sigma": self.sigma, "mu": self.mu}

    def block_loss(self, scores: torch.Tensor) -> torch.Tensor:
        """The loss of one block's scores, the positive at index 0."""
        scores = scores.float()
        weights = pair_weights(scores, self.mu).to(scores.dtype)
        return -(weights * F.logsigmoid(self.sigma * (scores[0] - scores[1:]))).mean() / math.log(2)

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        found = blocks(structure)
        if not found:
            return self._nothing_to_compare(outputs)
        return torch.stack([self.block_loss(outputs.scores[index]) for index in found]).mean()
