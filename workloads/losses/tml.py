import torch

from workloads.losses.base import MarginPairLoss, ModelOutputs
from workloads.losses.contrastive import distances, normalized

TML_REDUCTIONS = ("all", "nonzero")


class TripletMargin(MarginPairLoss):
    """TML: triplet margin loss over relevance classes (CFT eq. 3).

    Anchor a = a relevant pair (q, d+); k+ = a relevant pair of a *different* query in the
    batch; k- = a non-relevant pair of the anchor's query; max(0, m + D(a, k+) - D(a, k-))
    with Euclidean D on L2-normalised Phi, over every such (a, k+, k-) in the batch.

    Reductions:

    - ``all`` (default, METHODS' plain mean): the mean over every triplet, satisfied ones
      (zero terms) included, so the loss shrinks as triplets are learned;
    - ``nonzero``: the mean over the triplets with a positive term, as the library CFT used
      (pytorch-metric-learning's ``TripletMarginLoss`` with its ``AvgNonZeroReducer``; its
      default margin is 0.05 on unit vectors, against 0.5 here).

    Args:
        margin: m.
        reduction: ``all`` or ``nonzero``.
    """

    name = "tml"
    hyperparameters = {"contrastive_margin": "margin", "tml_reduction": "reduction"}
    searchable = ("contrastive_margin",)
    default_margin = 0.5

    def __init__(self, margin: float | None = None, reduction: str = "all") -> None:
        super().__init__(margin)
        if reduction not in TML_REDUCTIONS:
            raise ValueError(f"unknown TML reduction '{reduction}' (known: {', '.join(TML_REDUCTIONS)})")
        self.reduction = reduction

    @property
    def config(self) -> dict[str, float | str]:
        return {"margin": self.margin, "reduction": self.reduction}

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
        terms = torch.relu(self.margin + distance[:, :, None] - distance[:, None, :])[valid]
        if self.reduction == "nonzero":
            active = terms > 0
            # every triplet satisfied: a zero that keeps the graph (not degenerate: it compared)
            return terms[active].mean() if active.any() else terms.sum() * 0.0
        return terms.mean()
