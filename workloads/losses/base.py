"""The interface every loss follows (after sentence-transformers' cross-encoder losses).

``forward(outputs, structure)`` takes the model's outputs (scores and Phi) and the batch's
structure (:class:`PairStructure`: which pairs share a query, which are relevant), and
returns a scalar. ``config`` holds the hyper-parameters (logged with runs).
A batch in which a loss has nothing to compare (e.g. no negative for any positive) gives a
zero that keeps the graph, and is counted in ``degenerate_batches``; never NaN.

Each loss declares its hyper-parameters once, as typed :class:`Parameter` declarations in
``declared_parameters`` (the ``SUPPORTED_PARAMS`` idea of ir_measures): the ``LossSpec``
field and the constructor argument it feeds, its type (``float``, ``int`` or a ``Literal`` of
choices), default, bounds, description, whether a sweep may search it, and the value that
reproduces what trials computed before it existed (``keyed_default``). Everything else is
generated from these declarations: the ``LossSpec`` field (``workloads.kinds.rerank.spec``), the
construction (``workloads.losses.build_loss``), the sweep's search space (the re-ranking kind's
searched parameters, generated into ``SearchSpec`` in ``orchestrator.sweep.grid``) and the
parameter's part in a trial's identity (``workloads.kinds.rerank.identity.rerank_key``). ``hyperparameters`` (field -> argument) and
``searchable`` (the searchable fields) are derived from them, never declared. Several losses
reading one ``LossSpec`` field share one declaration (``MARGIN`` here, ``TAU`` and
``CONTRASTIVE_MARGIN`` in ``workloads.losses.contrastive``; :meth:`Parameter.taken_as` when a
constructor names the argument differently): one field, one type, default and bounds.

Counters that change training (a step counter, degenerate batches) are part of the
module's ``state_dict`` (``get_extra_state``), so a resumed trial continues exactly where
the checkpoint left it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn


@dataclass
class PairStructure:
    """Per-pair facts of a batch, aligned with the model's outputs (all tensors of length B)."""

    labels: torch.Tensor      # float: 1.0 relevant, 0.0 not
    query_ids: torch.Tensor   # long: the same number for pairs of the same query (within the batch)
    triple_ids: torch.Tensor  # long: pairs made from the same (q, d+, d-) triple
    augmented: torch.Tensor   # bool: produced by an augmenter
    source: torch.Tensor      # long: index of the original pair an augmented pair was made from, else -1
    # float: a teacher's score of each pair (mined rows keep their miner's scores; NaN: none), else None
    teacher: torch.Tensor | None = None

    def _tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.labels, self.query_ids, self.triple_ids, self.augmented, self.source, self.teacher

    def to(self, device: torch.device, non_blocking: bool = False) -> PairStructure:
        return PairStructure(*(t if t is None else t.to(device, non_blocking=non_blocking) for t in self._tensors()))

    def pin_memory(self) -> PairStructure:
        """Page-locked copies: a blocking copy to the GPU would wait for the GPU's queued work."""
        return PairStructure(*(t if t is None else t.pin_memory() for t in self._tensors()))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class ModelOutputs:
    scores: torch.Tensor  # [B]
    phi: torch.Tensor     # [B, H]


_FROM_DEFAULT: Any = object()  # keyed_default not given: the default


@dataclass(frozen=True, kw_only=True)
class Parameter:
    """One hyper-parameter of a loss, declared once.

    ``field`` is its ``LossSpec`` field (its name everywhere outside the loss's constructor,
    YAML files included, where ``alias`` replaces it when set), ``argument`` the constructor
    argument it feeds (default: ``field``). ``annotation`` is its type: ``float``, ``int`` or
    ``Literal[...]`` of its choices; ``gt``/``ge``/``lt``/``le`` bound a number.
    ``searchable``: a sweep's ``search`` may give it a range or choices.

    ``keyed_default`` is the value that computes what trials computed before the parameter
    existed (default: ``default``): a trial whose losses do not read the parameter, or read
    it at that value, keeps the identity it had then (``workloads.kinds.rerank.identity.rerank_key``).
    Give it only when the parameter's default computes something new, e.g. a reading added
    with a new default.
    """

    field: str
    annotation: Any
    default: Any
    description: str
    argument: str = ""
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    alias: str | None = None
    searchable: bool = False
    keyed_default: Any = _FROM_DEFAULT

    def __post_init__(self) -> None:
        if not self.argument:
            object.__setattr__(self, "argument", self.field)
        if self.keyed_default is _FROM_DEFAULT:
            object.__setattr__(self, "keyed_default", self.default)

    @property
    def bounds(self) -> dict[str, float]:
        """The bounds that are set, as pydantic ``Field`` arguments."""
        return {k: v for k in ("gt", "ge", "lt", "le") if (v := getattr(self, k)) is not None}

    @property
    def shown(self) -> str:
        """The name a YAML file gives it."""
        return self.alias or self.field

    def taken_as(self, argument: str) -> Parameter:
        """The same declaration, fed to a constructor argument of another name."""
        return replace(self, argument=argument)

    def compatible(self, other: Parameter) -> bool:
        """Whether two losses declare one ``LossSpec`` field alike (the constructor argument may differ)."""
        return replace(self, argument=self.field) == replace(other, argument=other.field)


MARGIN = Parameter(field="margin", annotation=float, default=1.0, gt=0, searchable=True,
                   description="hinge margin of pairwise and mhl")


class PairLoss(nn.Module):
    """A loss: ``name`` (how a spec names it), ``declared_parameters`` (its hyper-parameters,
    see :class:`Parameter`); ``hyperparameters`` (``LossSpec`` field -> constructor argument)
    and ``searchable`` (the fields a sweep may search) are derived from the declarations.
    (Not ``parameters``: that is ``nn.Module``'s own, its trained tensors.)"""

    name: ClassVar[str] = ""
    declared_parameters: ClassVar[tuple[Parameter, ...]] = ()
    hyperparameters: ClassVar[dict[str, str]] = {}  # derived: LossSpec field -> constructor argument
    searchable: ClassVar[tuple[str, ...]] = ()      # derived: LossSpec fields a sweep may search
    needs_hidden_size: ClassVar[bool] = False       # the constructor takes the encoder's hidden size
    needs_augmentation: ClassVar[bool] = False  # contrasts pairs with their augmented views: needs an augmenter
    needs_teacher: ClassVar[bool] = False  # regresses on a teacher's scores: only mined negatives carry them

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "hyperparameters" in vars(cls) or "searchable" in vars(cls):
            raise TypeError(f"{cls.__name__}: declare declared_parameters; hyperparameters and searchable are derived")
        fields = [p.field for p in cls.declared_parameters]
        if len(set(fields)) != len(fields):
            raise TypeError(f"{cls.__name__} declares a parameter twice: {fields}")
        cls.hyperparameters = {p.field: p.argument for p in cls.declared_parameters}
        cls.searchable = tuple(p.field for p in cls.declared_parameters if p.searchable)

    def __init__(self) -> None:
        super().__init__()
        self.degenerate_batches = 0
        # The named parts of the last value, for logging (a combined loss: ranking, contrastive),
        # 0-d tensors on the loss's device: reading them is the logger's business.
        self.last_parts: dict[str, torch.Tensor] = {}

    @property
    def config(self) -> dict[str, float | str]:
        return {}

    def forward(self, outputs: ModelOutputs, structure: PairStructure) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _nothing_to_compare(self, outputs: ModelOutputs) -> torch.Tensor:
        self.degenerate_batches += 1
        # A zero that keeps the graph, through the loss's own parameters too: data-parallel
        # training expects a gradient (here 0) for every parameter in every step.
        zero = (outputs.scores.sum() + outputs.phi.sum()) * 0.0
        for parameter in self.parameters():
            zero = zero + parameter.sum() * 0.0
        return zero

    def get_extra_state(self) -> dict:
        return {"degenerate_batches": self.degenerate_batches}

    def set_extra_state(self, state: dict) -> None:
        self.degenerate_batches = int(state.get("degenerate_batches", 0))


class MarginPairLoss(PairLoss):
    """A loss with a margin (hinge, centroid triplet, triplet margin): the declared parameter
    whose constructor argument is ``margin``, its declared default when not given."""

    def __init__(self, margin: float | None = None) -> None:
        super().__init__()
        self.margin = self.default_margin() if margin is None else margin

    @classmethod
    def default_margin(cls) -> float:
        return next(p.default for p in cls.declared_parameters if p.argument == "margin")

    @property
    def config(self) -> dict[str, float | str]:
        return {"margin": self.margin}
