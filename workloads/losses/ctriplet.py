from typing import Literal

import torch

from workloads.losses.base import MarginPairLoss, ModelOutputs, Parameter
from workloads.losses.contrastive import CONTRASTIVE_MARGIN, normalized

CTRIPLET_CENTROIDS = ("leave_one_out", "inclusive")
CENTROID = Parameter(
    field="ctriplet_centroid", argument="centroid", annotation=Literal[CTRIPLET_CENTROIDS], default="leave_one_out",
    keyed_default="inclusive",  # what ctriplet computed before leave_one_out existed
    description="ctriplet: the own-class centroid without the pair itself (Wieczorek et al.) or with it")


class RankingCTriplet(MarginPairLoss):
    """RankingCTriplet: centroid triplet loss per query (AUG eq. 19-21).

    Reading implemented (the standard centroid triplet loss of Wieczorek et al., which AUG
    cites; AUG's eq. 20 as printed compares d+ with c_P and d- with c_N): for each query in
    the batch, every pair x_i of that query contributes
    [||Phi_i - c_own||^2 - ||Phi_i - c_other||^2 + alpha]_+ with c_own the centroid of its
    own class (relevant or not, original and augmented pairs alike) and c_other the other
    class's centroid. Phi is L2-normalised. The loss is the mean over contributing pairs.

    Which pairs form c_own:

    - ``leave_one_out`` (default): the other members of x_i's class, never x_i itself, as in
      Wieczorek et al., where the anchor is compared with centroids it is not part of. A
      pair alone in its class (no augmentation, one triple of its query in the batch) has
      no own centroid and contributes nothing.
    - ``inclusive``: every member, x_i included. A class of one member gives
      ||Phi_i - c_own|| = 0, so its term only pushes x_i away from the other centroid.

    Queries lacking either class contribute nothing; a batch where no pair contributes is
    degenerate (a zero, counted).

    Args:
        margin: alpha.
        centroid: ``leave_one_out`` or ``inclusive``.
    """

    name = "ctriplet"
    declared_parameters = (CONTRASTIVE_MARGIN, CENTROID)

    def __init__(self, margin: float | None = None, centroid: str = "leave_one_out") -> None:
        super().__init__(margin)
        if centroid not in CTRIPLET_CENTROIDS:
            raise ValueError(f"unknown centroid '{centroid}' (known: {', '.join(CTRIPLET_CENTROIDS)})")
        self.centroid = centroid

    @property
    def config(self) -> dict[str, float | str]:
        return {"margin": self.margin, "centroid": self.centroid}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        phi = normalized(outputs.phi)
        relevant = structure.labels > 0.5
        leave_one_out = self.centroid == "leave_one_out"
        terms = []
        for query in structure.query_ids.unique():
            mine = structure.query_ids == query
            pos, neg = mine & relevant, mine & ~relevant
            if not pos.any() or not neg.any():
                continue
            members = phi[mine]
            is_pos = relevant[mine]
            sums = {True: phi[pos].sum(dim=0), False: phi[neg].sum(dim=0)}
            sizes = {True: int(pos.sum()), False: int(neg.sum())}
            own_sum = torch.where(is_pos[:, None], sums[True], sums[False])
            own_size = torch.where(is_pos, sizes[True], sizes[False]).to(phi.dtype)
            other = torch.where(is_pos[:, None], sums[False] / sizes[False], sums[True] / sizes[True])
            if leave_one_out:
                keep = own_size > 1
                if not keep.any():
                    continue
                own = (own_sum[keep] - members[keep]) / (own_size[keep, None] - 1)
                members, other = members[keep], other[keep]
            else:
                own = own_sum / own_size[:, None]
            d_own = ((members - own) ** 2).sum(dim=1)
            d_other = ((members - other) ** 2).sum(dim=1)
            terms.append(torch.relu(d_own - d_other + self.margin))
        if not terms:
            return self._nothing_to_compare(outputs)
        return torch.cat(terms).mean()
