"""SIR's curriculum objective (v3, v4): the re-ranking kind's :class:`~workloads.training.objective.TrainingObjective`
whose one forward runs every level of the curriculum (:mod:`workloads.kinds.rerank.sir`)."""

from __future__ import annotations

import torch

from workloads.kinds.rerank.sir import curriculum_loss
from workloads.losses import PairLoss
from workloads.losses.base import PairStructure
from workloads.models.cross_encoder import CrossEncoder
from workloads.training.objective import TrainingObjective


class CurriculumObjective(TrainingObjective):
    """SIR's levels in one forward of the objective (``workloads.kinds.rerank.sir``): level 1 scores every
    pair of the batch's blocks, each later level re-scores its survivors. One objective
    forward per step keeps data-parallel training to one forward per backward."""

    def __init__(self, model: CrossEncoder, loss_fn: PairLoss, amp_dtype: torch.dtype | None, sir, ranking: str) -> None:
        super().__init__(model, loss_fn, amp_dtype)
        self.sir, self.ranking = sir, ranking
        self.generator: torch.Generator | None = None  # set per step by the loop (random selection)

    def forward(self, inputs: dict[str, torch.Tensor], structure: PairStructure) -> torch.Tensor:
        def score(index: torch.Tensor) -> torch.Tensor:
            return self.pairs({k: v[index] for k, v in inputs.items()})[0]

        first = self.pairs(inputs)[0]
        return curriculum_loss(score, first, structure, self.sir, self.ranking, self.generator)
