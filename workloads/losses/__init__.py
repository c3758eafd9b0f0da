"""Loss registry: one module per loss, looked up by the name a trial spec uses.

A new loss is one module plus one registration: a ``PairLoss`` subclass declaring ``name``
and its hyper-parameters, once, as typed ``declared_parameters`` (:class:`Parameter`, see
``workloads.losses.base``), and one line in ``RANKING_LOSSES`` or ``CONTRASTIVE_LOSSES``.
Everything else is generated from the declarations: the ``LossSpec`` fields with their
types, defaults, bounds and descriptions, and their validation (``workloads.kinds.rerank.spec``),
construction (:func:`build_loss`), the sweep's search space (the re-ranking kind's searched
parameters, ``workloads.kinds.rerank.kind``, generated into ``SearchSpec`` in
``orchestrator.sweep.grid``) and trial identity (``workloads.kinds.rerank.identity.rerank_key``
leaves a new parameter out of the key where it is not read or at its ``keyed_default``, so
trials tracked before it existed keep their identity). The combination
(:class:`RankingWithContrastive`) declares the parameters of its weightings the same way
(``WEIGHTINGS``).

Hyper-parameters are named by their ``LossSpec`` field everywhere outside the loss's own
constructor; a field several losses read has one declaration (checked at import, see
:func:`collect_declarations`). Append to a registry, never reorder it: the registries' order
is the order of ``LossSpec``'s fields, which trial keys hash.
"""

from workloads.losses.base import ModelOutputs, PairLoss, Parameter
from workloads.losses.combined import WEIGHTINGS, RankingWithContrastive
from workloads.losses.ctriplet import RankingCTriplet
from workloads.losses.infonce import RankingInfoNCE
from workloads.losses.lambdaloss import LambdaLoss
from workloads.losses.listwise import ListwiseSoftmax, SIRLoss
from workloads.losses.margin_mse import MarginMSE
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
    LambdaLoss.name: LambdaLoss,
    MarginMSE.name: MarginMSE,
}
CONTRASTIVE_LOSSES: dict[str, type[PairLoss]] = {
    RankingSCL.name: RankingSCL,
    RankingCTriplet.name: RankingCTriplet,
    RankingInfoNCE.name: RankingInfoNCE,
    TripletMargin.name: TripletMargin,  # before nca: LossSpec's tml_* fields precede nca_*, as trial keys hash them
    RankingNCA.name: RankingNCA,
}
# Hyper-parameters of the combination (RankingWithContrastive), by weighting (its WEIGHTINGS).
WEIGHTING_PARAMETERS: dict[str, tuple[str, ...]] = {w: tuple(p.field for p in ps) for w, ps in WEIGHTINGS.items()}
SEARCHABLE_WEIGHTING_PARAMETERS = tuple(p.field for ps in WEIGHTINGS.values() for p in ps if p.searchable)


def collect_declarations(owners: dict[str, tuple[Parameter, ...]]) -> dict[str, Parameter]:
    """Every declaration by ``LossSpec`` field, in order of first declaration. A field that
    several owners (losses, weightings) declare must be declared alike: one type, default,
    bounds, description, searchability and keyed default (the constructor argument may differ)."""
    found: dict[str, tuple[str, Parameter]] = {}
    for owner, parameters in owners.items():
        for parameter in parameters:
            first_owner, first = found.setdefault(parameter.field, (owner, parameter))
            if not first.compatible(parameter):
                raise TypeError(f"LossSpec field '{parameter.field}' is declared differently by {first_owner} and {owner}: "
                                f"{first} != {parameter}")
    return {field: parameter for field, (_, parameter) in found.items()}


# Every loss hyper-parameter, by LossSpec field: the ranking losses', the weightings', the contrastive losses'.
PARAMETERS: dict[str, Parameter] = collect_declarations({
    **{f"ranking loss '{n}'": cls.declared_parameters for n, cls in RANKING_LOSSES.items()},
    **{f"weighting '{w}'": parameters for w, parameters in WEIGHTINGS.items()},
    **{f"contrastive loss '{n}'": cls.declared_parameters for n, cls in CONTRASTIVE_LOSSES.items()},
})
# The fields of each registry's losses, in registry order (LossSpec's order within each group).
RANKING_PARAMETERS = tuple(dict.fromkeys(p.field for cls in RANKING_LOSSES.values() for p in cls.declared_parameters))
CONTRASTIVE_PARAMETERS = tuple(dict.fromkeys(p.field for cls in CONTRASTIVE_LOSSES.values() for p in cls.declared_parameters))


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
        names += [p.field for p in WEIGHTINGS[spec.weighting] if p.searchable]
        names += CONTRASTIVE_LOSSES[spec.contrastive].searchable
    return tuple(names)


def needs_augmentation(spec) -> bool:
    """Whether ``spec``'s losses contrast pairs with their augmented views (a trial then needs an augmenter)."""
    return RANKING_LOSSES[spec.ranking].needs_augmentation or (
        spec.contrastive != "none" and CONTRASTIVE_LOSSES[spec.contrastive].needs_augmentation)


def teacher_losses(spec) -> list[str]:
    """The names of ``spec``'s losses that regress on a teacher's scores (the trial then needs mined negatives)."""
    losses = [RANKING_LOSSES[spec.ranking]] + ([CONTRASTIVE_LOSSES[spec.contrastive]] if spec.contrastive != "none" else [])
    return [loss.name for loss in losses if loss.needs_teacher]


def build_loss(spec, hidden_size: int) -> PairLoss:
    """The training loss of a ``workloads.spec.LossSpec``."""
    def settings(cls: type[PairLoss]) -> dict:
        return {field: getattr(spec, field) for field in cls.hyperparameters}

    ranking = build_ranking_loss(spec.ranking, **settings(RANKING_LOSSES[spec.ranking]))
    if spec.contrastive == "none":
        return ranking
    contrastive = build_contrastive_loss(spec.contrastive, hidden_size, **settings(CONTRASTIVE_LOSSES[spec.contrastive]))
    weights = {p.argument: getattr(spec, p.field) for p in RankingWithContrastive.declared_parameters}
    return RankingWithContrastive(ranking, contrastive, spec.weighting, **weights)


__all__ = ["ModelOutputs", "PairLoss", "Parameter", "RANKING_LOSSES", "CONTRASTIVE_LOSSES", "WEIGHTINGS", "WEIGHTING_PARAMETERS",
           "PARAMETERS", "RANKING_PARAMETERS", "CONTRASTIVE_PARAMETERS", "collect_declarations", "build_ranking_loss",
           "build_contrastive_loss", "build_loss", "needs_augmentation", "teacher_losses", "loss_parameters", "searchable_parameters",
           "RankingWithContrastive", "LambdaLoss"]
