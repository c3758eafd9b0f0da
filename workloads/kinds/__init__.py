"""Trial kinds: what a trial is, from what it requires to what it keeps.

A kind names every step of its lifecycle: the trials of other kinds it requires first (a
re-ranking trial that augments with a supervised selector requires that selector), prepare
(on the driver, cached by content), the inputs its workers read, train (per worker, in the
one epoch loop of :mod:`workloads.training.loop`), test the chosen checkpoint, and keep the
result (a selector is installed in the cache every trial shares); and everything the control
plane asks of it: its searched parameters, grid, tags, first stages and cost.

This package's face re-exports the three modules that name no kind:

- :mod:`workloads.kinds.protocol`: what a kind declares (:class:`TrialKind`, :class:`KindGrid`,
  :class:`SearchedParameter`, ...);
- :mod:`workloads.kinds.registry`: the registry (:data:`TRIAL_KINDS`, one line per kind) and
  what is asked of it (:func:`kind_of`, :func:`kind_named`, :func:`requirements`, ...);
- :mod:`workloads.kinds.lifecycle`: the rule for every kind (:func:`run_steps`, the one order
  of the steps; :func:`choose_epoch`; :func:`result_summary`; :func:`run_in_process`).

Each kind is a package ``workloads/kinds/<kind>/`` with the same file names for the same
roles: ``spec.py`` (its trial file's model and identity), ``kind.py`` (``KIND``, its
declaration), ``steps.py`` (prepare, test, keep: the driver's steps), ``train.py`` (the
workers' training), ``grid.py`` (its sweep grid), ``preflight.py`` where it has one. The
control plane imports kinds' generic things through this face only (``from workloads.kinds
import ...``), never a kind's package.
"""

from __future__ import annotations

from workloads.kinds.lifecycle import (
    EpochRecord,
    InProcessSteps,
    TrialSteps,
    choose_epoch,
    result_summary,
    run_in_process,
    run_steps,
)
from workloads.kinds.protocol import SELECTOR_DATA_TAG, GridCell, GridError, KindGrid, KindReport, SearchedParameter, TrialKind
from workloads.kinds.registry import (
    DEFAULT_KIND,
    TRIAL_KINDS,
    kind_named,
    kind_of,
    kind_with_run_kind,
    register_kind,
    requirements,
)

__all__ = ["DEFAULT_KIND", "SELECTOR_DATA_TAG", "TRIAL_KINDS", "EpochRecord", "GridCell", "GridError",
           "InProcessSteps", "KindGrid", "KindReport", "SearchedParameter", "TrialKind", "TrialSteps",
           "choose_epoch", "kind_named", "kind_of", "kind_with_run_kind", "register_kind", "requirements",
           "result_summary", "run_in_process", "run_steps"]
