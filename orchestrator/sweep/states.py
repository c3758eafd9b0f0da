"""Each grid cell's state, read from its MLflow cell run: what ``orchestrate status`` counts and
the report shows (:mod:`orchestrator.report.results` reads it from here; the sweep never
imports the report). Nothing is started or written.
"""

from __future__ import annotations

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import test_data_identity
from orchestrator.lifecycle.targets import targets
from orchestrator.sweep.grid import Cell, SweepSpec

STATUS_OK = "ok"  # tested on the data it has today; the other states: see cell_states


def cell_states(sweep: SweepSpec, tracker: Tracker) -> tuple[str | None, list[tuple[Cell, str, object | None]]]:
    """The sweep's MLflow experiment id (None before it ran) and every cell of the grid with its
    state and its MLflow cell run (None before it has one). A state is one of: ok, unavailable (no
    workload can run the cell yet), pending (no run yet), stale (tested on data that changed
    since), interrupted, failed or running."""
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    runs = []
    if experiment is not None:
        runs = tracker.client.search_runs([experiment.experiment_id], filter_string=f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'",
                                          max_results=50_000)
    by_key = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in runs}
    cells = sweep.cells
    runnable = next((c for c in cells if c.spec is not None), None)
    test_data = test_data_identity(targets(runnable.spec, sweep.zero_shot_targets)) if runnable is not None and runs else None
    states = []
    for cell in cells:
        run = by_key.get(cell.key)
        if cell.spec is None:
            status = "unavailable"
        elif run is None:
            status = "pending"
        elif run.info.status == "FINISHED":
            recorded = run.data.tags.get(schema.TEST_DATA_TAG)
            status = "stale" if recorded and recorded != test_data else STATUS_OK
        elif run.data.tags.get(schema.INTERRUPTED_TAG) == "true":
            status = "interrupted"
        elif run.info.status in ("FAILED", "KILLED"):
            status = "failed"
        else:
            status = "running"
        states.append((cell, status, run))
    return (experiment.experiment_id if experiment else None), states
