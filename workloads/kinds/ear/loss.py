"""EAR's training loss: a margin ranking loss over a query's expansions, the margin growing with
the gap between their labels.

The reranker's score M(q, e_i) estimates the rank BM25 gives the first relevant document for
q + e_i, so lower is better. For every pair of expansions with r_i < r_j (e_i retrieves a
relevant document higher up), the loss asks M(q, e_i) to be below M(q, e_j) by at least
(r_j - r_i) * alpha:

    L(q) = sum over r_i < r_j of max(0, M(q, e_i) - M(q, e_j) + (r_j - r_i) * alpha)

Pairs with equal labels (two expansions that both miss, at MAX_RANK) add nothing: only the
relative order is learnt. Written here: no library has this pairwise loss with a label-scaled
margin (torch's ``margin_ranking_loss`` takes one margin for every pair).
"""

from __future__ import annotations

import torch


def ear_loss(scores: torch.Tensor, ranks: torch.Tensor, alpha: float) -> torch.Tensor:
    """The loss of a batch of queries: ``scores`` and ``ranks`` are (queries, expansions); the
    per-query sums above, averaged over the queries."""
    if scores.shape != ranks.shape or scores.dim() != 2:
        raise ValueError(f"scores and ranks must both be (queries, expansions), got {tuple(scores.shape)} and {tuple(ranks.shape)}")
    ranks = ranks.to(scores.dtype)
    score_gap = scores[:, :, None] - scores[:, None, :]   # M_i - M_j
    label_gap = ranks[:, None, :] - ranks[:, :, None]     # r_j - r_i
    hinge = torch.clamp(score_gap + label_gap * alpha, min=0)
    return torch.where(label_gap > 0, hinge, torch.zeros_like(hinge)).sum(dim=(1, 2)).mean()


__all__ = ["ear_loss"]
