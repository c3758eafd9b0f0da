import torch

from workloads.losses.base import ModelOutputs, PairLoss


class PairwiseHinge(PairLoss):
    """Pairwise ranking loss (single hinge, SHL): mean of max(0, m - y^+ + y^-) over triples.

    AUG eq. 4; CFT eq. 1. Each positive is compared with the negative of its own triple.
    """

    name = "pairwise"

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        self.margin = margin

    @property
    def config(self) -> dict[str, float]:
        return {"margin": self.margin}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        s = outputs.scores
        positive = structure.labels > 0.5
        compared = (structure.triple_ids[:, None] == structure.triple_ids[None, :]) & positive[:, None] & ~positive[None, :]
        if not compared.any():
            return self._nothing_to_compare(outputs)
        hinge = torch.relu(self.margin - s[:, None] + s[None, :])
        return hinge[compared].mean()
