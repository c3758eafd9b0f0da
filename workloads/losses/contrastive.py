"""Shared pieces of the contrastive losses on pair representations Phi."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workloads.losses.base import Parameter

# Declarations several contrastive losses share (one LossSpec field each).
TAU = Parameter(field="tau", annotation=float, default=0.1, gt=0, searchable=True, description="temperature of scl and infonce")
CONTRASTIVE_MARGIN = Parameter(field="contrastive_margin", argument="margin", annotation=float, default=0.5, gt=0,
                               searchable=True, description="alpha of ctriplet, m of tml (on unit-norm Phi)")


def normalized(phi: torch.Tensor) -> torch.Tensor:
    """L2-normalised Phi: every contrastive loss here works on the unit sphere, so that
    temperatures and margins mean the same thing for every encoder (raw [CLS] norms vary
    by model and during training)."""
    return F.normalize(phi.float(), dim=-1)


def log_softmax_without_self(similarity: torch.Tensor) -> torch.Tensor:
    """Row-wise log softmax over k != i (the diagonal is excluded from every denominator)."""
    eye = torch.eye(similarity.shape[0], dtype=torch.bool, device=similarity.device)
    return torch.log_softmax(similarity.masked_fill(eye, float("-inf")), dim=1).masked_fill(eye, 0.0)


def squared_distances(z: torch.Tensor) -> torch.Tensor:
    """Pairwise ||z_i - z_j||^2, written out because cdist's backward is NaN at distance 0
    (the diagonal, or two identical texts in a batch)."""
    sq = (z * z).sum(dim=1)
    return (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp_min(0.0)


def distances(z: torch.Tensor) -> torch.Tensor:
    return squared_distances(z).clamp_min(1e-12).sqrt()
