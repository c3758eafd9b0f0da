import torch

from workloads.losses.base import MARGIN, MarginPairLoss, ModelOutputs


class MaxHinge(MarginPairLoss):
    """Max-hinge ranking loss (MHL): max(0, m - y^+ + max_i y^-_i) per positive.

    CFT eq. 2: the hardest negative is the highest-scoring non-relevant pair of the same
    query in the batch. Averaged over the positives that have at least one such negative.
    """

    name = "mhl"
    declared_parameters = (MARGIN,)

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        s = outputs.scores
        positive = structure.labels > 0.5
        same_query_negative = (structure.query_ids[:, None] == structure.query_ids[None, :]) & ~positive[None, :]
        hardest = s[None, :].expand(len(s), -1).masked_fill(~same_query_negative, float("-inf")).max(dim=1).values
        anchors = positive & same_query_negative.any(dim=1)
        if not anchors.any():
            return self._nothing_to_compare(outputs)
        return torch.relu(self.margin - s[anchors] + hardest[anchors]).mean()
