"""Listwise losses over blocks: one positive and its negatives (a ``per_query`` batch row).

A block is every pair of one ``triple_ids`` value (the row it was made from); its positive
is its relevant pair. ``P`` is the softmax of the block's scores.

- ``listwise``: softmax cross-entropy, -log P(d+).
- ``sir``: SIR's per-level loss (Pu et al., eq. 1-2): -log P(o^0) - sum_{j>=1} log(1 - P(o^j)),
  which also pushes every negative down on its own (not plain listwise cross-entropy).

Both are means over the blocks of the batch; a block without a negative compares nothing
(a batch of only such blocks is degenerate). The per-distribution forms
(:func:`listwise_terms`, :func:`sir_terms`) are what the SIR curriculum applies to each
level's (or conditional) probabilities (``workloads.kinds.rerank.sir``).
"""

from __future__ import annotations

import torch

from workloads.losses.base import ModelOutputs, PairLoss

_TINY = 1e-12


def listwise_terms(log_p: torch.Tensor) -> torch.Tensor:
    """-log P(positive) of one block, the positive at index 0."""
    return -log_p[0]


def sir_terms(log_p: torch.Tensor) -> torch.Tensor:
    """SIR eq. 1 of one block, the positive at index 0: -log P(o^0) - sum_j log(1 - P(o^j))."""
    negatives = log_p[1:].exp()
    return -log_p[0] - torch.log((1.0 - negatives).clamp(min=_TINY)).sum()


def blocks(structure) -> list[torch.Tensor]:
    """The pair indices of every block with one positive and at least one negative, positive first."""
    out = []
    for block in torch.unique(structure.triple_ids, sorted=True):
        members = (structure.triple_ids == block).nonzero(as_tuple=True)[0]
        relevant = structure.labels[members] > 0.5
        if int(relevant.sum()) != 1 or bool(relevant.all()):
            continue
        out.append(torch.cat([members[relevant], members[~relevant]]))
    return out


class _BlockLoss(PairLoss):
    def terms(self, log_p: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        found = blocks(structure)
        if not found:
            return self._nothing_to_compare(outputs)
        return torch.stack([self.terms(torch.log_softmax(outputs.scores[index], dim=0)) for index in found]).mean()


class ListwiseSoftmax(_BlockLoss):
    """Listwise softmax cross-entropy over each block: -log P(d+)."""

    name = "listwise"

    def terms(self, log_p: torch.Tensor) -> torch.Tensor:
        return listwise_terms(log_p)


class SIRLoss(_BlockLoss):
    """SIR's per-level loss (Pu et al., eq. 1-2) over each block: -log P(o^0) - sum_j log(1 - P(o^j))."""

    name = "sir"

    def terms(self, log_p: torch.Tensor) -> torch.Tensor:
        return sir_terms(log_p)
