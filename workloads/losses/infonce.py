import torch

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.contrastive import TAU, log_softmax_without_self, normalized


class RankingInfoNCE(PairLoss):
    """RankingInfoNCE: the augmented view of a relevant pair is its positive (AUG eq. 22-26).

    Anchor i = an original relevant pair (q, d+); its positive j = the augmented pair
    (q, d+_a) made from it (``structure.source[j] == i``); the negatives are every other
    pair of the batch. loss_i = -log( exp(cos(Phi_i, Phi_j)/t) / sum_{k != i} exp(cos(Phi_i, Phi_k)/t) ),
    averaged over anchors. Needs augmentation: without augmented pairs there is no anchor.

    Args:
        temperature: t (the spec's ``tau``).
    """

    name = "infonce"
    needs_augmentation = True
    declared_parameters = (TAU.taken_as("temperature"),)

    def __init__(self, temperature: float = 0.1) -> None:
        super().__init__()
        self.temperature = temperature

    @property
    def config(self) -> dict[str, float | str]:
        return {"temperature": self.temperature}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        views = (structure.source >= 0) & (structure.labels > 0.5)
        if not views.any():
            return self._nothing_to_compare(outputs)
        phi = normalized(outputs.phi)
        log_prob = log_softmax_without_self(phi @ phi.T / self.temperature)
        view_index = torch.nonzero(views).squeeze(1)
        anchor_index = structure.source[view_index]
        return -log_prob[anchor_index, view_index].mean()
