import torch

from workloads.losses.base import MARGIN, MarginPairLoss, ModelOutputs


class PairwiseHinge(MarginPairLoss):
    """Pairwise ranking loss (single hinge, SHL): mean of max(0, m - y^+ + y^-) over triples.

    AUG eq. 4; CFT eq. 1. Each positive is compared with the negative of its own triple.
    """

    name = "pairwise"
    declared_parameters = (MARGIN,)

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        s = outputs.scores
        positive = structure.labels > 0.5
        compared = (structure.triple_ids[:, None] == structure.triple_ids[None, :]) & positive[:, None] & ~positive[None, :]
        if not compared.any():
            return self._nothing_to_compare(outputs)
        hinge = torch.relu(self.margin - s[:, None] + s[None, :])
        return hinge[compared].mean()
