from typing import Literal

import torch

from workloads.losses.base import MarginPairLoss, ModelOutputs, Parameter
from workloads.losses.contrastive import CONTRASTIVE_MARGIN, distances, normalized

TML_REDUCTIONS = ("all", "nonzero")
TML_ANCHORS = ("positives", "all")
REDUCTION = Parameter(field="tml_reduction", argument="reduction", annotation=Literal[TML_REDUCTIONS], default="all",
                      description="tml: mean over all triplets, or over the non-zero ones (CFT's library)")
ANCHORS = Parameter(field="tml_anchors", argument="anchors", annotation=Literal[TML_ANCHORS], default="positives",
                    description="tml: relevant anchors, k+ of other queries, k- of the anchor's query (CFT eq. 3), "
                                "or every label-defined triplet (CFT's library)")


class TripletMargin(MarginPairLoss):
    """TML: triplet margin loss over relevance classes (CFT eq. 3).

    Triplets (``anchors``):

    - ``positives`` (default, CFT eq. 3): anchor a = a relevant pair (q, d+); k+ = a
      relevant pair of a *different* query in the batch; k- = a non-relevant pair of the
      anchor's query;
    - ``all``: every label-defined triplet, what the library CFT used computes from
      relevance labels alone (pytorch-metric-learning's ``TripletMarginLoss``): any a,
      any k+ != a with a's label, any k- with the other label, whatever their queries, so
      non-relevant pairs are anchors too.

    Each term is max(0, m + D(a, k+) - D(a, k-)) with Euclidean D on L2-normalised Phi.

    Reductions:

    - ``all`` (default, the plain mean): the mean over every triplet, satisfied ones
      (zero terms) included, so the loss shrinks as triplets are learned;
    - ``nonzero``: the mean over the triplets with a positive term, as the library CFT used
      (pytorch-metric-learning's ``TripletMarginLoss`` with its ``AvgNonZeroReducer``; its
      default margin is 0.05 on unit vectors, against 0.5 here).

    Args:
        margin: m.
        reduction: ``all`` or ``nonzero``.
        anchors: ``positives`` or ``all``.
    """

    name = "tml"
    declared_parameters = (CONTRASTIVE_MARGIN, REDUCTION, ANCHORS)

    def __init__(self, margin: float | None = None, reduction: str = "all", anchors: str = "positives") -> None:
        super().__init__(margin)
        if reduction not in TML_REDUCTIONS:
            raise ValueError(f"unknown TML reduction '{reduction}' (known: {', '.join(TML_REDUCTIONS)})")
        if anchors not in TML_ANCHORS:
            raise ValueError(f"unknown TML anchors '{anchors}' (known: {', '.join(TML_ANCHORS)})")
        self.reduction, self.anchors = reduction, anchors

    @property
    def config(self) -> dict[str, float | str]:
        return {"margin": self.margin, "reduction": self.reduction, "anchors": self.anchors}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        phi = normalized(outputs.phi)
        distance = distances(phi)
        relevant = structure.labels > 0.5
        same_query = structure.query_ids[:, None] == structure.query_ids[None, :]
        if self.anchors == "all":
            same_label = relevant[:, None] == relevant[None, :]
            positive = same_label & ~torch.eye(len(relevant), dtype=torch.bool, device=relevant.device)  # [a, k+]
            negative = ~same_label                                                                       # [a, k-]
        else:
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
