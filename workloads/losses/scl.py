from typing import Literal

import torch

from workloads.losses.base import ModelOutputs, PairLoss, Parameter
from workloads.losses.contrastive import TAU, log_softmax_without_self, normalized

SCL_NORMALIZATIONS = ("per_anchor", "global")
NORMALIZATION = Parameter(
    field="scl_normalization", argument="normalization", annotation=Literal[SCL_NORMALIZATIONS], default="per_anchor",
    description="scl: 1/|P(i)| per anchor, mean over anchors (the method's), or AUG eq. 17's one global 1/N+")


class RankingSCL(PairLoss):
    """RankingSCL: supervised contrastive loss over relevant pairs of the same query.

    AUG eq. 17-18 (after Khosla et al.'s SupCon). For each anchor i with y_i = 1, its
    positives P(i) are the other pairs j != i with q_j = q_i and y_j = 1 (augmented ones
    included); l_ij = -log softmax_{k != i}(Phi_i . Phi_k / tau)_j. The denominator runs over
    every other pair of the batch, negatives included. Phi is L2-normalised.

    Two normalisations, which weigh anchors differently (so lambda and tau tuned under one
    do not transfer to the other):

    - ``per_anchor`` (default; SupCon's L^out): loss_i = (1/|P(i)|) sum_{j in P(i)} l_ij,
      averaged over the anchors with at least one positive;
    - ``global`` (AUG eq. 17 as printed): (1/N+) sum_i sum_{j in P(i)} l_ij, one global
      factor with N+ the number of relevant pairs in the batch (anchors without a positive
      count in N+ but add nothing).

    Args:
        tau: the temperature.
        normalization: ``per_anchor`` or ``global``.
    """

    name = "scl"
    declared_parameters = (TAU, NORMALIZATION)

    def __init__(self, tau: float = 0.1, normalization: str = "per_anchor") -> None:
        super().__init__()
        if normalization not in SCL_NORMALIZATIONS:
            raise ValueError(f"unknown SCL normalization '{normalization}' (known: {', '.join(SCL_NORMALIZATIONS)})")
        self.tau = tau
        self.normalization = normalization

    @property
    def config(self) -> dict[str, float | str]:
        return {"tau": self.tau, "normalization": self.normalization}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        phi = normalized(outputs.phi)
        log_prob = log_softmax_without_self(phi @ phi.T / self.tau)
        relevant = structure.labels > 0.5
        eye = torch.eye(len(relevant), dtype=torch.bool, device=phi.device)
        positives = (structure.query_ids[:, None] == structure.query_ids[None, :]) & relevant[:, None] & relevant[None, :] & ~eye
        counts = positives.sum(dim=1)
        anchors = counts > 0
        if not anchors.any():
            return self._nothing_to_compare(outputs)
        summed = -(log_prob * positives).sum(dim=1)
        if self.normalization == "global":
            return summed[anchors].sum() / relevant.sum()
        return (summed[anchors] / counts[anchors]).mean()
