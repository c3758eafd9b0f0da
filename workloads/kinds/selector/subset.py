"""Relaxed top-k subset sampling (Xie and Ermon, *Reparameterizable Subset Sampling via
Continuous Relaxations*, IJCAI 2019), as select-and-rank trains its selector with it.

Training: keys r = log_softmax(scores) + Gumbel noise; k' = min(k, n) successive softmaxes
at temperature tau, each damping what was picked (alpha += log(1 - p_j)); the relaxed
k-hot v = sum_j p_j. Straight-through: the forward value is the exact k-hot of top-k'(v),
the gradient is v's. Evaluation: the deterministic top-k of the raw scores.

Written by hand: no library we use ships a straight-through relaxed subset sampler.
"""

from __future__ import annotations

import torch

_NEGATIVE = -1e9  # masked sentences: finite, so a row without sentences stays NaN-free


def _per_row_k(mask: torch.Tensor, k: int) -> torch.Tensor:
    return mask.sum(-1).clamp(max=k)


def _k_hot(values: torch.Tensor, mask: torch.Tensor, k_rows: torch.Tensor) -> torch.Tensor:
    """1.0 at the ``k_rows[b]`` highest values of each row (masked positions never; ties: the
    earlier position), else 0.0."""
    filled = values.masked_fill(~mask, float("-inf"))
    order = torch.sort(filled, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    return ((rank < k_rows.unsqueeze(-1)) & mask).to(values.dtype)


def topk_mask(scores: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    """Evaluation: the exact k-hot of the k highest scores per row (all sentences when fewer)."""
    return _k_hot(scores.detach(), mask, _per_row_k(mask, k))


def relaxed_topk(scores: torch.Tensor, mask: torch.Tensor, k: int, tau: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Training: a k-hot sample per row, exact forward, relaxed (differentiable) backward.

    ``scores`` [B, S], ``mask`` [B, S] bool (real sentences). Returns [B, S] whose values are
    exactly 0 or 1 and whose gradient w.r.t. ``scores`` is the relaxed k-hot's.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    masked = scores.masked_fill(~mask, _NEGATIVE)
    log_p = torch.log_softmax(masked, dim=-1)
    uniform = torch.rand(scores.shape, generator=generator, device="cpu" if generator is None else generator.device)
    gumbel = -torch.log(-torch.log(uniform.to(scores.device).clamp(1e-20, 1.0 - 1e-7)))
    alpha = (log_p + gumbel).masked_fill(~mask, _NEGATIVE)
    k_rows = _per_row_k(mask, k)
    relaxed = torch.zeros_like(scores)
    for j in range(int(k_rows.max().item()) if mask.any() else 0):
        p = torch.softmax(alpha / tau, dim=-1) * mask
        active = (j < k_rows).to(scores.dtype).unsqueeze(-1)  # rows with fewer sentences stop earlier
        relaxed = relaxed + active * p
        alpha = alpha + torch.log((1.0 - p).clamp(min=1e-20))
    hard = _k_hot(relaxed.detach(), mask, k_rows)
    return hard - relaxed.detach() + relaxed
