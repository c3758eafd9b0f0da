"""Sweeps: the grid of cells, one Optuna study per cell served to Ray Tune, the runner that resumes.

The package's face: what the commands, the report and the docs use, each from the module that
owns it (imported when first asked for, so that reading a sweep file does not start Ray's,
Optuna's or MLflow's imports):

- :mod:`~orchestrator.sweep.grid`: the sweep spec, its cells (expanded once, ``SweepSpec.cells``), :func:`load_sweep`;
- :mod:`~orchestrator.sweep.dry_run`: ``--dry-run``'s report and the whole preflight, the preparation units;
- :mod:`~orchestrator.sweep.runner`: :func:`run_sweep`, the sequence of a real run;
- :mod:`~orchestrator.sweep.search` and :mod:`~orchestrator.sweep.tune`: the cells' studies as one Tune searcher,
  the Tune run, its MLflow logger and progress display;
- :mod:`~orchestrator.sweep.winners`: each cell's winner tested, what the storage keeps, the seeds' statistics;
- :mod:`~orchestrator.sweep.status`: ``orchestrate status`` and each cell's state;
- :mod:`~orchestrator.sweep.store`: whose store it is, who runs it; :mod:`~orchestrator.sweep.estimate`: the compute.
"""

from __future__ import annotations

import importlib

_OWNERS = {
    "orchestrator.sweep.grid": ("Cell", "SearchSpec", "SweepSpec", "ZeroShotTarget", "load_sweep", "sweep_specs"),
    "orchestrator.sweep.dry_run": ("dry_run", "dry_run_report", "preflight", "preparation_units"),
    "orchestrator.sweep.runner": ("run_sweep",),
    "orchestrator.sweep.status": ("STATUS_OK", "cell_states", "sweep_status"),
    "orchestrator.sweep.store": ("claim_store", "sweep_paths"),
    "orchestrator.sweep.estimate": ("estimate",),
}
_OWNER = {name: module for module, names in _OWNERS.items() for name in names}

__all__ = sorted(_OWNER)


def __getattr__(name: str):
    if name in _OWNER:
        return getattr(importlib.import_module(_OWNER[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
