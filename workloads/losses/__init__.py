"""Loss registry: one module per loss, looked up by the name a trial spec uses."""

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.combined import RankingWithContrastive
from workloads.losses.ctriplet import RankingCTriplet
from workloads.losses.infonce import RankingInfoNCE
from workloads.losses.mhl import MaxHinge
from workloads.losses.nca import RankingNCA
from workloads.losses.pairwise import PairwiseHinge
from workloads.losses.pointwise import PointwiseBCE
from workloads.losses.scl import RankingSCL
from workloads.losses.tml import TripletMargin

RANKING_LOSSES: dict[str, type[PairLoss]] = {
    PointwiseBCE.name: PointwiseBCE,
    PairwiseHinge.name: PairwiseHinge,
    MaxHinge.name: MaxHinge,
}
CONTRASTIVE_LOSSES: dict[str, type[PairLoss]] = {
    RankingSCL.name: RankingSCL,
    RankingCTriplet.name: RankingCTriplet,
    RankingInfoNCE.name: RankingInfoNCE,
    RankingNCA.name: RankingNCA,
    TripletMargin.name: TripletMargin,
}


def build_ranking_loss(name: str, margin: float = 1.0) -> PairLoss:
    if name not in RANKING_LOSSES:
        raise ValueError(f"unknown ranking loss '{name}' (known: {', '.join(RANKING_LOSSES)})")
    cls = RANKING_LOSSES[name]
    return cls(margin=margin) if cls is not PointwiseBCE else cls()


def build_contrastive_loss(name: str, *, tau: float = 0.1, margin: float = 0.5, learned_map: bool = False,
                           hidden_size: int | None = None) -> PairLoss:
    if name not in CONTRASTIVE_LOSSES:
        raise ValueError(f"unknown contrastive loss '{name}' (known: {', '.join(CONTRASTIVE_LOSSES)})")
    if name == "scl":
        return RankingSCL(tau=tau)
    if name == "infonce":
        return RankingInfoNCE(temperature=tau)
    if name == "nca":
        return RankingNCA(hidden_size=hidden_size, learned_map=learned_map)
    return CONTRASTIVE_LOSSES[name](margin=margin)


def build_loss(spec, hidden_size: int) -> PairLoss:
    """The training loss of a ``workloads.spec.LossSpec``."""
    ranking = build_ranking_loss(spec.ranking, spec.margin)
    if spec.contrastive == "none":
        return ranking
    contrastive = build_contrastive_loss(spec.contrastive, tau=spec.tau, margin=spec.contrastive_margin,
                                         learned_map=spec.nca_map == "learned", hidden_size=hidden_size)
    return RankingWithContrastive(ranking, contrastive, spec.weighting, spec.lambda_, spec.dwa_period)


__all__ = ["ModelOutputs", "PairLoss", "RANKING_LOSSES", "CONTRASTIVE_LOSSES", "build_ranking_loss",
           "build_contrastive_loss", "build_loss", "RankingWithContrastive"]
