"""What ``orchestrate run`` shows of a trial whose kind reports its own result (an EAR trial:
its test comparison), rather than the run store's table of validation and test measures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KindReport:
    """``fields``: the trial's JSON beside its name; ``heading``, a table of ``rows`` (label ->
    measures) and ``closing``: its text; ``comparison``: what a sweep's cell run keeps of it
    (``<kind>_comparison.json``), beside the trial file of its winner (``<kind>_trial.yaml``)."""

    fields: dict
    heading: str
    rows: list[tuple[str, dict[str, float]]]
    closing: list[str] = field(default_factory=list)
    comparison: dict = field(default_factory=dict)
