import torch

from workloads.losses.base import MarginPairLoss, ModelOutputs
from workloads.losses.contrastive import distances, normalized


class TripletMargin(MarginPairLoss):
    """TML: triplet margin loss over relevance classes (CFT eq. 3).

    Anchor a = a relevant pair (q, d+); k+ = a relevant pair of a *different* query in the
    batch; k- = a non-relevant pair of the anchor's query; max(0, m + D(a, k+) - D(a, k-))
    with Euclidean D on L2-normalised Phi, averaged over every such (a, k+, k-) in the batch.
    """

    name = "tml"
    default_margin = 0.5

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        phi = normalized(outputs.phi)
        distance = distances(phi)
        relevant = structure.labels > 0.5
        same_query = structure.query_ids[:, None] == structure.query_ids[None, :]
        positive = relevant[:, None] & relevant[None, :] & ~same_query      # [a, k+]
        negative = relevant[:, None] & ~relevant[None, :] & same_query      # [a, k-]
        valid = positive[:, :, None] & negative[:, None, :]                 # [a, k+, k-]
        if not valid.any():
            return self._nothing_to_compare(outputs)
        hinge = torch.relu(self.margin + distance[:, :, None] - distance[:, None, :])
        return hinge[valid].mean()
