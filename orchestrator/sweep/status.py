"""``orchestrate status``: a sweep's progress from MLflow (runs) and Optuna (trials left), read
only; each grid cell's state, read from its MLflow cell run (:func:`cell_states`: what status
counts and the report shows; :mod:`orchestrator.report.results` reads it from here, the sweep
never imports the report); and the finished trials trained on other data than the cells' today
(which the sweep refuses to mix with new ones). Nothing is started or written.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import test_data_identity, training_data_identity
from orchestrator.lifecycle.targets import targets
from orchestrator.sweep.dry_run import dry_run_report
from orchestrator.sweep.grid import Cell, SweepSpec, sweep_file
from orchestrator.sweep.store import check_store_owner, sweep_paths
from orchestrator.sweep.winners import checkpoint_disk_use
from workloads.core.errors import InputError
from workloads.data.identity import collection_found

STATUS_OK = "ok"  # tested on the data it has today; the other states: see cell_states


def cell_states(sweep: SweepSpec, tracker: Tracker) -> tuple[str | None, list[tuple[Cell, str, object | None]]]:
    """The sweep's MLflow experiment id (None before it ran) and every cell of the grid with its
    state and its MLflow cell run (None before it has one). A state is one of: ok, unavailable (no
    workload can run the cell yet), pending (no run yet), stale (tested on data that changed
    since; a tested cell whose test data is not found here is ok: :func:`cannot_check_line`
    says so), interrupted, failed or running."""
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    runs = []
    if experiment is not None:
        runs = tracker.client.search_runs([experiment.experiment_id], filter_string=f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'",
                                          max_results=50_000)
    by_key = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in runs}
    cells = sweep.cells
    runnable = next((c for c in cells if c.spec is not None), None)
    # a collection not found here has another identity than the one tested: it cannot be compared
    test_data = (test_data_identity(targets(runnable.spec, sweep.zero_shot_targets))
                 if runnable is not None and runs and not unfound_test_collections(sweep) else None)
    states = []
    for cell in cells:
        run = by_key.get(cell.key)
        if cell.spec is None:
            status = "unavailable"
        elif run is None:
            status = "pending"
        elif run.info.status == "FINISHED":
            recorded = run.data.tags.get(schema.TEST_DATA_TAG)
            status = "stale" if recorded and test_data and recorded != test_data else STATUS_OK
        elif run.data.tags.get(schema.INTERRUPTED_TAG) == "true":
            status = "interrupted"
        elif run.info.status in ("FAILED", "KILLED"):
            status = "failed"
        else:
            status = "running"
        states.append((cell, status, run))
    return (experiment.experiment_id if experiment else None), states


def unfound_test_collections(sweep: SweepSpec) -> list[str]:
    """The collections the sweep's winners are tested on that are not found on this machine."""
    runnable = next((c for c in sweep.cells if c.spec is not None), None)
    if runnable is None:
        return []
    refs = [t.spec.data.test_collection or t.spec.data.collection for t in targets(runnable.spec, sweep.zero_shot_targets)]
    return [ref for ref in dict.fromkeys(refs) if not collection_found(ref)]


def cannot_check_line(sweep: SweepSpec) -> str | None:
    """What status and the report say when the test data cannot be checked here (never "stale":
    testing again would find the same data once it is found)."""
    unfound = unfound_test_collections(sweep)
    if not unfound:
        return None
    return (f"cannot check: {', '.join(unfound)} not found (set ORCHESTRATE_DATA_DIR to the data directory the sweep "
            "ran with): whether its cells were tested on today's data is unknown")


def sweep_status(sweep: SweepSpec, tracker: Tracker | None, storage_root: Path) -> dict:
    """Progress from MLflow (runs) and Optuna (trials left), read only: nothing is started or
    written. Every cell is in exactly one state: done, failed, stale (tested on data that changed
    since), interrupted, running (some trial ended or runs, not yet tested) or pending."""
    paths = sweep_paths(sweep, storage_root)
    experiment = tracker.client.get_experiment_by_name(sweep.name) if tracker is not None else None
    if experiment is None and not (paths.root / "optuna.db").exists():
        where = f"{paths.root}" + (f" or in {tracker.uri}" if tracker is not None else "")
        raise InputError(sweep_file(sweep) or sweep.name, f"no trace of sweep '{sweep.name}' in {where}: it has not "
                                                          "started there (give --storage and --tracking-uri of the store "
                                                          "it ran with)")
    check_store_owner(sweep, paths, tracker, experiment)
    plan = dry_run_report(sweep, paths)

    def runs_where(query: str) -> list:
        # MLflow loads every param, metric and tag of each run it finds (a trial run has ~100
        # params): only the runs status reads are asked for, never the finished trials (doc19:
        # 3,060 runs; 1,020 took 3 s per search), which Optuna counts.
        if experiment is None:
            return []
        return tracker.client.search_runs([experiment.experiment_id], query, max_results=50_000)

    trial = f"tags.`{schema.KIND_TAG}` = '{schema.TRIAL}'"
    by_status = {status: runs_where(f"{trial} and attributes.status = '{status}'") for status in ("FAILED", "RUNNING", "KILLED")}
    selector_runs = runs_where(f"tags.`{schema.KIND_TAG}` = '{schema.SELECTOR}'")
    cell_state = _cell_states(sweep, tracker if experiment else None, plan, by_status["RUNNING"])
    count = lambda state: sum(1 for v in cell_state.values() if v == state)  # noqa: E731
    interrupted = [r for r in by_status["KILLED"] if r.data.tags.get(schema.INTERRUPTED_TAG) == "true"]
    pruned = [r for r in by_status["KILLED"] if schema.PRUNED_TAG in r.data.tags]
    scored = [d for d in plan["cells_detail"] if d["best"] is not None]
    best = max(scored, key=lambda d: d["best"], default=None)
    complete = sum(d["trials_complete"] for d in plan["cells_detail"])
    timed = complete + sum(d["trials_pruned"] for d in plan["cells_detail"])
    mean_wall = sum(d["trial_seconds"] for d in plan["cells_detail"]) / timed if timed else None
    parallel = max(1, len(by_status["RUNNING"]))
    return {
        "sweep": sweep.name,
        "cells": plan["runnable_cells"],
        "cells_done": count("done"),
        "cells_failed": count("failed"),
        "cells_stale": count("stale"),
        "cells_interrupted": count("interrupted"),
        "cells_running": count("running"),
        "cells_pending": count("pending"),
        "trials_finished": complete,  # Optuna's COMPLETE trials: their runs are FINISHED
        "trials_failed": len(by_status["FAILED"]),
        "trials_pruned": len(pruned),
        "trials_interrupted": len(interrupted),
        "trials_running": len(by_status["RUNNING"]),
        "trials_to_run": plan["trials_to_run"],
        "best": {"cell": best["key"], "axes": "/".join(best[k] for k in ("model", "loss", "augmentation", "size")),
                 "value": best["best"]} if best else None,
        "mean_trial_seconds": mean_wall,
        "eta_seconds": mean_wall * plan["trials_to_run"] / parallel if mean_wall is not None else None,
        **checkpoint_disk_use(paths.ray_storage),
        "selectors": len(plan.get("selectors", [])),
        "selectors_trained": sum(1 for s in plan.get("selectors", []) if s["trained"]),
        "selector_runs": [{"name": r.info.run_name, "status": r.info.status,
                           "val_ndcg_at_10": r.data.metrics.get(schema.BEST_OBJECTIVE),
                           "test_ndcg_at_10": r.data.metrics.get(f"{schema.target_prefix(schema.TEST)}ndcg_at_10")}
                          for r in sorted(selector_runs, key=lambda r: r.info.run_name or "")],
        "data_unchecked": cannot_check_line(sweep) if experiment is not None else None,
        "failed_trials": [f"{r.info.run_name} ({r.data.tags.get(schema.CELL_TAG)}): {r.data.tags.get(schema.FAILURE_TAG, '?')} "
                          f"{r.data.tags.get(schema.ERROR_TAG, '')}".strip() for r in by_status["FAILED"]],
    }


def _cell_states(sweep: SweepSpec, tracker: Tracker | None, plan: dict, trials: list) -> dict[str, str]:
    """Each runnable cell's one state: done, failed, stale, interrupted, running or pending."""
    results = {cell.key: status for cell, status, _ in cell_states(sweep, tracker)[1]} if tracker is not None else {}
    begun = {d["key"] for d in plan["cells_detail"] if d["trials_done"]}
    begun |= {r.data.tags.get(schema.CELL_TAG) for r in trials if r.info.status == "RUNNING"}
    states = {}
    for detail in plan["cells_detail"]:
        if detail["unavailable"]:
            continue
        state = {STATUS_OK: "done", "failed": "failed", "stale": "stale", "interrupted": "interrupted"}.get(
            results.get(detail["key"], ""), None)
        states[detail["key"]] = state or ("running" if detail["key"] in begun else "pending")
    return states


def stale_trials(tracker: Tracker, experiment_id: str, cells: list[Cell]) -> list[str]:
    """Finished trial runs trained on other data than the cells' today (their recorded training
    data identity differs); runs written before identities were recorded are taken as they are."""
    current = {c.key: training_data_identity(c.spec) for c in cells}
    stale = []
    for run in tracker.runs_of_kind(experiment_id, schema.TRIAL):
        recorded = run.data.tags.get(schema.DATA_TAG)
        cell = run.data.tags.get(schema.CELL_TAG)
        if recorded and cell in current and run.info.status == "FINISHED" and recorded != current[cell]:
            stale.append(run.info.run_name or run.info.run_id)
    return stale
