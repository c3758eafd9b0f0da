"""Loss registry: one module per loss, looked up by the name a trial spec uses."""

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.mhl import MaxHinge
from workloads.losses.pairwise import PairwiseHinge
from workloads.losses.pointwise import PointwiseBCE

RANKING_LOSSES: dict[str, type[PairLoss]] = {
    PointwiseBCE.name: PointwiseBCE,
    PairwiseHinge.name: PairwiseHinge,
    MaxHinge.name: MaxHinge,
}


def build_ranking_loss(name: str, margin: float = 1.0) -> PairLoss:
    if name not in RANKING_LOSSES:
        raise ValueError(f"unknown ranking loss '{name}' (known: {', '.join(RANKING_LOSSES)})")
    cls = RANKING_LOSSES[name]
    return cls(margin=margin) if cls is not PointwiseBCE else cls()


__all__ = ["ModelOutputs", "PairLoss", "RANKING_LOSSES", "build_ranking_loss"]
