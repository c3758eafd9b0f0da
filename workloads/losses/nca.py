from typing import Literal

import torch
from torch import nn

from workloads.losses.base import ModelOutputs, PairLoss, Parameter
from workloads.losses.contrastive import log_softmax_without_self, normalized, squared_distances

NCA_MAPS = ("learned", "identity")
MAP = Parameter(field="nca_map", argument="map", annotation=Literal[NCA_MAPS], default="learned",
                keyed_default="identity",  # NCA's map before it learned one by default
                description="nca: a learned linear map A (identity-initialised) or A = I (then NCA = SCL at tau = s/2)")
SCALE = Parameter(field="nca_scale", argument="scale", annotation=float, default=1.0, gt=0, searchable=True,
                  description="nca: s in exp(-||A Phi_i - A Phi_j||^2 / s)")


class RankingNCA(PairLoss):
    """RankingNCA: neighbourhood component analysis over relevant pairs (AUG eq. 27-30).

    p_ij = exp(-||A z_i - A z_j||^2 / s) / sum_{k != i} exp(-||A z_i - A z_k||^2 / s), z the
    L2-normalised Phi, and loss = -mean_i log sum_{j in C_i} p_ij, with C_i the other
    relevant pairs of the same query and i over relevant pairs with a non-empty C_i (the
    log of a sum over neighbours, not a mean of logs). AUG writes a sum over i; the mean
    keeps lambda's meaning independent of the batch size. AUG's equation has s = 1.

    A is a learned linear map initialised to the identity (``map='learned'``, the default:
    NCA learns its metric, Goldberger et al.), or the identity itself. Why the default is
    learned: on unit vectors ||z_i - z_j||^2 = 2 - 2 z_i . z_j, so with the identity map
    p_ij = softmax_{k != i}(2 z_i . z_k / s)_j, and when every anchor has one same-query
    positive (the usual batch of triples plus augmentation) identity-NCA *is* RankingSCL at
    tau = s / 2, loss and gradients alike: a grid with identity-NCA at s = 1 repeats one
    point of its SCL column. With several positives the two still differ (log of a sum here,
    a mean of logs in SCL). The scale s is a hyper-parameter (searchable).

    The learned map is trained with the encoder (synchronised across data-parallel
    workers), exempt from weight decay (decay would pull it towards 0, not towards its
    identity initialisation) and clipped with the encoder's gradients.

    Args:
        hidden_size: the encoder's hidden size (the learned map is hidden x hidden).
        map: ``learned`` or ``identity``.
        scale: s.
    """

    name = "nca"
    declared_parameters = (MAP, SCALE)
    needs_hidden_size = True

    def __init__(self, hidden_size: int | None = None, map: str = "learned", scale: float = 1.0) -> None:
        super().__init__()
        if map not in NCA_MAPS:
            raise ValueError(f"unknown NCA map '{map}' (known: {', '.join(NCA_MAPS)})")
        self.learned_map = map == "learned"
        self.scale = scale
        self.map: nn.Module = nn.Identity()
        if self.learned_map:
            if hidden_size is None:
                raise ValueError("a learned NCA map needs the encoder's hidden size")
            self.map = nn.Linear(hidden_size, hidden_size, bias=False)
            nn.init.eye_(self.map.weight)

    @property
    def config(self) -> dict[str, float | str]:
        return {"map": "learned" if self.learned_map else "identity", "scale": self.scale}

    def forward(self, outputs: ModelOutputs, structure) -> torch.Tensor:
        z = self.map(normalized(outputs.phi))
        log_p = log_softmax_without_self(-squared_distances(z) / self.scale)
        relevant = structure.labels > 0.5
        eye = torch.eye(len(relevant), dtype=torch.bool, device=z.device)
        neighbours = (structure.query_ids[:, None] == structure.query_ids[None, :]) & relevant[:, None] & relevant[None, :] & ~eye
        anchors = neighbours.any(dim=1)
        if not anchors.any():
            return self._nothing_to_compare(outputs)
        log_mass = torch.logsumexp(log_p.masked_fill(~neighbours, float("-inf")), dim=1)
        return -log_mass[anchors].mean()
