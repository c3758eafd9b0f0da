"""The registry of trial kinds: one line per kind (:data:`TRIAL_KINDS`), and what is asked of it.

A new kind is a package ``workloads/kinds/<kind>/`` whose ``kind.py`` declares ``KIND``
(:class:`~workloads.kinds.protocol.TrialKind`), plus one line in the registry below (or
:func:`register_kind` at run time); registering it registers the first stages and miners it
serves. Everything else asks the registry for a kind (:func:`kind_of` a spec,
:func:`kind_named` a file's ``kind:``, :func:`kind_with_run_kind` a run's tag), never names
one. The contract tests run over the registry.
"""

from __future__ import annotations

from workloads.kinds.dense.kind import KIND as DENSE
from workloads.kinds.ear.kind import KIND as EAR
from workloads.kinds.protocol import TrialKind
from workloads.kinds.rerank.kind import KIND as RERANK
from workloads.kinds.selector.kind import KIND as SELECTOR
from workloads.retrieval.first_stage import register_first_stage
from workloads.retrieval.mining import register_miner

TRIAL_KINDS: dict[str, TrialKind] = {}
DEFAULT_KIND = "rerank"  # a trial file (or a sweep's base) without ``kind:`` holds re-ranking trials


def register_kind(kind: TrialKind) -> None:
    """Add a kind to :data:`TRIAL_KINDS`, with the first stages and miners it serves."""
    known = TRIAL_KINDS.get(kind.name)
    if known is not None and known is not kind:
        raise ValueError(f"trial kind '{kind.name}' is registered twice")
    for first_stage in kind.first_stages:
        register_first_stage(first_stage)
    for miner in kind.miners:
        register_miner(miner)
    TRIAL_KINDS[kind.name] = kind


for _kind in (RERANK, SELECTOR, EAR, DENSE):  # the registry: one entry per kind
    register_kind(_kind)


def kind_of(spec) -> TrialKind:
    for kind in TRIAL_KINDS.values():
        if isinstance(spec, kind.spec):
            return kind
    raise TypeError(f"no trial kind runs a {type(spec).__name__}")


def kind_named(name: str | None) -> TrialKind:
    """The kind a file's ``kind:`` names (None: the default kind); KeyError for an unknown name."""
    return TRIAL_KINDS[DEFAULT_KIND if name is None else name]


def kind_with_run_kind(run_kind: str) -> TrialKind | None:
    """The kind whose runs carry this KIND_TAG value, if any."""
    return next((kind for kind in TRIAL_KINDS.values() if kind.run_kind == run_kind), None)


def requirements(specs) -> list:
    """The distinct trials (of any kind) that ``specs`` require first, in order, each once."""
    found: dict[str, object] = {}
    for spec in specs:
        for required in kind_of(spec).requires(spec):
            found.setdefault(kind_of(required).key(required), required)
    return list(found.values())


__all__ = ["DEFAULT_KIND", "TRIAL_KINDS", "kind_named", "kind_of", "kind_with_run_kind", "register_kind", "requirements"]
