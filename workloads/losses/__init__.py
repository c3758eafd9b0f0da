"""Loss registry: one module per loss, looked up by the name a trial spec uses.

A new loss is one module (a ``PairLoss`` subclass declaring ``name``, ``hyperparameters``
and ``searchable``) plus one line in ``RANKING_LOSSES`` or ``CONTRASTIVE_LOSSES``; spec
validation (``workloads.spec.LossSpec``), construction (:func:`build_loss`) and the sweep's
search space read those declarations. Hyper-parameters are named by their ``LossSpec``
field everywhere outside the loss's own constructor.
"""

from workloads.losses.base import ModelOutputs, PairLoss
from workloads.losses.combined import RankingWithContrastive
from workloads.losses.ctriplet import RankingCTriplet
from workloads.losses.infonce import RankingInfoNCE
from workloads.losses.listwise import ListwiseSoftmax, SIRLoss
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
    ListwiseSoftmax.name: ListwiseSoftmax,
    SIRLoss.name: SIRLoss,
}
CONTRASTIVE_LOSSES: dict[str, type[PairLoss]] = {
    RankingSCL.name: RankingSCL,
    RankingCTriplet.name: RankingCTriplet,
    RankingInfoNCE.name: RankingInfoNCE,
    RankingNCA.name: RankingNCA,
    TripletMargin.name: TripletMargin,
}
# Hyper-parameters of the combination (RankingWithContrastive), by weighting.
WEIGHTING_PARAMETERS: dict[str, tuple[str, ...]] = {"fixed": ("lambda_",), "equal": (), "dwa": ("dwa_period",)}
SEARCHABLE_WEIGHTING_PARAMETERS = ("lambda_",)


def _construct(registry: dict[str, type[PairLoss]], kind: str, name: str, settings: dict, hidden_size: int | None) -> PairLoss:
    if name not in registry:
        raise ValueError(f"unknown {kind} loss '{name}' (known: {', '.join(registry)})")
    cls = registry[name]
    unknown = set(settings) - set(cls.hyperparameters)
    if unknown:
        raise ValueError(f"{kind} loss '{name}' has no hyper-parameter {', '.join(sorted(unknown))} "
                         f"(it has: {', '.join(cls.hyperparameters) or 'none'})")
    kwargs = {cls.hyperparameters[field]: value for field, value in settings.items()}
    if cls.needs_hidden_size:
        kwargs["hidden_size"] = hidden_size
    return cls(**kwargs)


def build_ranking_loss(name: str, **settings) -> PairLoss:
    """A ranking loss; ``settings`` by LossSpec field name (e.g. ``margin=1.0``)."""
    return _construct(RANKING_LOSSES, "ranking", name, settings, None)


def build_contrastive_loss(name: str, hidden_size: int | None = None, **settings) -> PairLoss:
    """A contrastive loss; ``settings`` by LossSpec field name (e.g. ``tau=0.1``, ``contrastive_margin=0.5``)."""
    return _construct(CONTRASTIVE_LOSSES, "contrastive", name, settings, hidden_size)


def loss_parameters(spec) -> tuple[str, ...]:
    """The LossSpec fields that take effect for ``spec``'s ranking loss, contrastive loss and weighting."""
    names = list(RANKING_LOSSES[spec.ranking].hyperparameters)
    if spec.contrastive != "none":
        names += WEIGHTING_PARAMETERS[spec.weighting]
        names += CONTRASTIVE_LOSSES[spec.contrastive].hyperparameters
    return tuple(names)


def searchable_parameters(spec) -> tuple[str, ...]:
    """The LossSpec fields a sweep searches for ``spec`` (ranking, then weighting, then contrastive)."""
    names = list(RANKING_LOSSES[spec.ranking].searchable)
    if spec.contrastive != "none":
        names += [p for p in WEIGHTING_PARAMETERS[spec.weighting] if p in SEARCHABLE_WEIGHTING_PARAMETERS]
        names += CONTRASTIVE_LOSSES[spec.contrastive].searchable
    return tuple(names)


def build_loss(spec, hidden_size: int) -> PairLoss:
    """The training loss of a ``workloads.spec.LossSpec``."""
    def settings(cls: type[PairLoss]) -> dict:
        return {field: getattr(spec, field) for field in cls.hyperparameters}

    ranking = build_ranking_loss(spec.ranking, **settings(RANKING_LOSSES[spec.ranking]))
    if spec.contrastive == "none":
        return ranking
    contrastive = build_contrastive_loss(spec.contrastive, hidden_size, **settings(CONTRASTIVE_LOSSES[spec.contrastive]))
    return RankingWithContrastive(ranking, contrastive, spec.weighting, spec.lambda_, spec.dwa_period)


__all__ = ["ModelOutputs", "PairLoss", "RANKING_LOSSES", "CONTRASTIVE_LOSSES", "WEIGHTING_PARAMETERS", "build_ranking_loss",
           "build_contrastive_loss", "build_loss", "loss_parameters", "searchable_parameters", "RankingWithContrastive"]
