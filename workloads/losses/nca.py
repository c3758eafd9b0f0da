import torch
from torch import nn

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.contrastive import log_softmax_without_self, normalized, squared_distances


class RankingNCA(PairLoss):
    """RankingNCA: neighbourhood component analysis over relevant pairs (AUG eq. 27-30).

    p_ij = exp(-||A Phi_i - A Phi_j||^2) / sum_{k != i} exp(-||A Phi_i - A Phi_k||^2) and
    loss = -mean_i log sum_{j in C_i} p_ij, with C_i the other relevant pairs of the same
    query and i over relevant pairs with a non-empty C_i. AUG writes a sum over i; the mean
    keeps lambda's meaning independent of the batch size. A is a learned linear map
    initialised to the identity (``learned_map=True``) or the identity itself. Phi is
    L2-normalised before A.
    """

    name = "nca"

    def __init__(self, hidden_size: int | None = None, learned_map: bool = False) -> None:
        super().__init__()
        self.learned_map = learned_map
        self.map: nn.Module = nn.Identity()
        if learned_map:
            if hidden_size is None:
                raise ValueError("a learned NCA map needs the encoder's hidden size")
            self.map = nn.Linear(hidden_size, hidden_size, bias=False)
            nn.init.eye_(self.map.weight)

    @property
    def config(self) -> dict[str, float]:
        return {"learned_map": float(self.learned_map)}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        z = self.map(normalized(outputs.phi))
        log_p = log_softmax_without_self(-squared_distances(z))
        relevant = structure.labels > 0.5
        eye = torch.eye(len(relevant), dtype=torch.bool, device=z.device)
        neighbours = (structure.query_ids[:, None] == structure.query_ids[None, :]) & relevant[:, None] & relevant[None, :] & ~eye
        anchors = neighbours.any(dim=1)
        if not anchors.any():
            return self._nothing_to_compare(outputs)
        log_mass = torch.logsumexp(log_p.masked_fill(~neighbours, float("-inf")), dim=1)
        return -log_mass[anchors].mean()
