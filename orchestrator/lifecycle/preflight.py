"""What would stop a trial, found offline before anything is prepared or written, asked of its
kind (``TrialKind.preflight`` and ``TrialKind.configuration_problems``)."""

from __future__ import annotations

from collections.abc import Iterable

from workloads.core.errors import InputError
from workloads.kinds import kind_of, requirements


def preflight(spec) -> list[str]:
    """What would stop the trial before it computes anything (a model that cannot load here, a
    collection that is neither local nor an ir_datasets id, a file that does not exist), then
    what would stop each trial it requires (an EAR first stage's EAR trial). One line each."""
    problems = dict.fromkeys(kind_of(spec).preflight(spec))
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
