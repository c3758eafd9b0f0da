import torch

from workloads.losses.base import MarginPairLoss, ModelOutputs
from workloads.losses.contrastive import normalized


class RankingCTriplet(MarginPairLoss):
    """RankingCTriplet: centroid triplet loss per query (AUG eq. 19-21).

    Reading implemented (the standard centroid triplet loss of Wieczorek et al., which AUG
    cites; AUG's eq. 20 as printed compares d+ with c_P and d- with c_N): for each query in
    the batch, c_P is the mean Phi of its relevant pairs (original and augmented) and c_N
    the mean Phi of its non-relevant pairs; every pair x_i of that query contributes
    [||Phi_i - c_own||^2 - ||Phi_i - c_other||^2 + alpha]_+ with c_own the centroid of its
    own class and c_other the other one. Phi is L2-normalised. Queries lacking either class
    contribute nothing; the loss is the mean over contributing pairs.
    """

    name = "ctriplet"
    default_margin = 0.5

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        phi = normalized(outputs.phi)
        relevant = structure.labels > 0.5
        terms = []
        for query in structure.query_ids.unique():
            mine = structure.query_ids == query
            pos, neg = mine & relevant, mine & ~relevant
            if not pos.any() or not neg.any():
                continue
            c_pos, c_neg = phi[pos].mean(dim=0), phi[neg].mean(dim=0)
            d_pos = ((phi[mine] - c_pos) ** 2).sum(dim=1)
            d_neg = ((phi[mine] - c_neg) ** 2).sum(dim=1)
            is_pos = relevant[mine]
            own = torch.where(is_pos, d_pos, d_neg)
            other = torch.where(is_pos, d_neg, d_pos)
            terms.append(torch.relu(own - other + self.margin))
        if not terms:
            return self._nothing_to_compare(outputs)
        return torch.cat(terms).mean()
