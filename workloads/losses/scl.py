import torch

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.contrastive import log_softmax_without_self, normalized


class RankingSCL(PairLoss):
    """RankingSCL: supervised contrastive loss over relevant pairs of the same query.

    AUG eq. 17-18 (after Khosla et al.'s SupCon). For each anchor i with y_i = 1, its
    positives P(i) are the other pairs j != i with q_j = q_i and y_j = 1 (augmented ones
    included); loss_i = -(1/|P(i)|) sum_{j in P(i)} log softmax_{k != i}(Phi_i . Phi_k / tau)_j.
    The denominator runs over every other pair of the batch, negatives included. Phi is
    L2-normalised. Averaged over anchors with at least one positive.
    """

    name = "scl"

    def __init__(self, tau: float = 0.1) -> None:
        super().__init__()
        self.tau = tau

    @property
    def config(self) -> dict[str, float]:
        return {"tau": self.tau}

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
        per_anchor = -(log_prob * positives).sum(dim=1)[anchors] / counts[anchors]
        return per_anchor.mean()
