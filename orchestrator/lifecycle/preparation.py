"""Preparation: every trial's data built on the driver, before any training.

A unit is what one trial (or one grid cell) reads: the data of the trials it requires (a
supervised augmentation's selector), its own (first-stage runs, training set, augmentation
sets, token ids, candidate lists) and each evaluation target's. Everything is cached by
content, so preparing again reuses what exists. ``orchestrate prepare`` runs the units of a
trial file or a sweep on their own (on a cluster: on CPU nodes before any GPU is paid for);
``orchestrate sweep`` and ``run`` prepare the same units before they train.

Before any of it, what would stop a trial is found offline, asked of its kind
(``TrialKind.preflight`` and ``TrialKind.configuration_problems``): :func:`preflight` and
:func:`refuse_configuration_problems`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.lifecycle.targets import targets
from workloads.core.errors import InputError, RequirementNotTrained
from workloads.core.logs import clock, get_logger
from workloads.core.paths import cache_dir, data_dir
from workloads.kinds import kind_of, requirements
from workloads.models.cross_encoder import fetch_model

log = get_logger("prepare")


@dataclass(frozen=True)
class Unit:
    """A trial's (or a cell's) data: ``specs`` prepared in order, required trials first."""

    label: str
    specs: tuple


@dataclass
class UnitReport:
    label: str
    seconds: float
    waiting: str | None = None   # what it waits for (a selector not trained yet), or None when complete
    specs: int = 0

    @property
    def complete(self) -> bool:
        return self.waiting is None


def trial_unit(label: str, specs: Sequence, zero_shot: Sequence[tuple] = ()) -> Unit:
    """The unit of one trial (its variants share the label: a cell's spec per searched k_a):
    required trials first, then each variant, then every evaluation target beyond its own."""
    ordered: dict[str, object] = {}
    for spec in specs:
        for required in kind_of(spec).requires(spec):
            ordered.setdefault(f"{kind_of(required).name}:{kind_of(required).key(required)}", required)
    for index, spec in enumerate(specs):
        ordered[f"trial:{index}"] = spec
    for index, target in enumerate(targets(specs[0], zero_shot)[1:]):
        ordered[f"target:{index}"] = target.spec
    return Unit(label, tuple(ordered.values()))


def cache_files() -> int:
    """Files in the cache: ``orchestrate prepare`` counts them before and after (once per command:
    a shared cache on a network file system is slow to walk)."""
    root = cache_dir()
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def fetch_models(units: Sequence[Unit]) -> None:
    """Download every distinct Hugging Face model the units load (their kinds' ``models``: a dense
    trial's generator too; a no-op for local ones, and for those already in the Hugging Face
    cache): on a cluster, ``orchestrate prepare`` on the head fills the shared cache, so no GPU
    node waits on a download."""
    names: dict[str, str] = {}  # model -> the first field naming it (for the message)
    for spec in (spec for unit in units for spec in unit.specs):
        for field, name in kind_of(spec).models(spec):
            names.setdefault(name, field)
    for name, field in names.items():
        started = time.perf_counter()
        where = fetch_model(name, field)
        if where is not None:
            log.info("model %s: in the Hugging Face cache (%s), %.1fs", name, where, time.perf_counter() - started)


def prepare_units(units: Sequence[Unit]) -> list[UnitReport]:
    """Prepare every unit, logging one line each (how long); a unit whose augmentation needs a
    selector that is not trained yet stops there and says so."""
    reports = []
    begun = time.perf_counter()
    for number, unit in enumerate(units, 1):
        started = time.perf_counter()
        waiting = None
        for spec in unit.specs:
            try:
                kind_of(spec).prepare(spec)
            except RequirementNotTrained as exc:
                waiting = exc.problem
                break
        report = UnitReport(unit.label, time.perf_counter() - started, waiting, len(unit.specs))
        reports.append(report)
        state = f"waits: {waiting}" if waiting else "ready"
        # the units left at the mean pace so far (the first units build what later ones reuse: an upper bound)
        left = (time.perf_counter() - begun) / number * (len(units) - number)
        log.info("prepared [%d/%d] %s: %s (%.1fs; ETA %s)", number, len(units), unit.label, state, report.seconds, clock(left))
    return reports


__all__ = ["Unit", "UnitReport", "trial_unit", "prepare_units", "cache_files"]


# ----------------------------------------------------------------------------- what would stop a trial

def preflight(spec) -> list[str]:
    """What would stop the trial before it computes anything (a model that cannot load here, a
    collection that is neither local nor an ir_datasets id, a file that does not exist), then
    what would stop each trial it requires (an EAR first stage's EAR trial). One line each."""
    problems = dict.fromkeys(kind_of(spec).preflight(spec))
    for directory in (cache_dir, data_dir):  # a variable naming a file: the trial would stop on its first read
        try:
            directory()
        except InputError as exc:
            problems[str(exc)] = None
    try:
        required = requirements([spec])
    except InputError as exc:  # a required trial's file that cannot be read
        return list(problems | {str(exc): None})
    for each in required:
        problems |= dict.fromkeys(kind_of(each).preflight(each))
    return list(problems)


def refuse_configuration_problems(specs: Iterable, source: str) -> None:
    """One line (exit 2) for the first of the problems that can never run, whatever is installed or
    downloaded (its kind's ``configuration_problems``), of any of ``specs``
    (a unit lists its required trials too: each is checked by its own kind), before anything
    is prepared or written."""
    seen: set[str] = set()
    for spec in specs:
        if (identity := f"{type(spec).__name__}:{spec.model_dump_json()}") in seen:
            continue
        seen.add(identity)
        problems = kind_of(spec).configuration_problems(spec)
        if problems:
            raise InputError(f"{source}: trial {spec.name}", problems[0])
