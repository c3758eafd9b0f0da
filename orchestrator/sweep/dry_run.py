"""``orchestrate sweep --dry-run``: what a sweep is before it runs, read without computing
anything: each cell's progress from the Optuna storage, the report (:func:`dry_run`: counts,
required trials, the compute estimate), the whole preflight (:func:`preflight`: the evaluation
targets held out by their queries, what would stop any cell, what the workers' storage lacks),
each cell's data variants and preparation units, and the MLflow experiment's description.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna

from orchestrator.core import schema
from orchestrator.core.staging import staging_problems
from orchestrator.core.tracking import check_sqlite_file
from orchestrator.lifecycle.identity import trial_key
from orchestrator.lifecycle.preparation import preflight as trial_preflight
from orchestrator.lifecycle.preparation import trial_unit
from orchestrator.lifecycle.targets import targets
from orchestrator.sweep.estimate import choose_profile, estimate, load_throughputs
from orchestrator.sweep.grid import Cell, SweepSpec, check_targets, sweep_file, sweep_specs
from orchestrator.sweep.search import COUNTED, count_finished, optuna_storage
from orchestrator.sweep.store import SweepPaths
from workloads.kinds import TRIAL_KINDS, kind_of, requirements


@dataclass
class CellProgress:
    cell: Cell
    trials_finished: int
    trials_complete: int
    trials_failed: int
    best: float | None
    trials_pruned: int = 0
    trial_seconds: float = 0.0  # the complete and pruned trials' time, from Optuna's start to its result (summed)


def progress(sweep: SweepSpec, paths: SweepPaths | None) -> list[CellProgress]:
    """What each cell has done, read from the Optuna storage (nothing is started)."""
    cells = sweep.cells
    existing: set[str] = set()
    if paths is not None and (paths.root / "optuna.db").exists():
        check_sqlite_file(paths.root / "optuna.db", "Optuna storage")
        storage = optuna_storage(paths.optuna_url)
        # (names only: Optuna's study summaries read every trial of every study to find its best)
        existing = {s.study_name for s in storage.get_all_studies()}
    out = []
    for cell in cells:
        if cell.spec is None or cell.key not in existing:
            out.append(CellProgress(cell, 0, 0, 0, None, 0))
            continue
        trials = storage.get_all_trials(storage.get_study_id_from_name(cell.key), deepcopy=False)  # read once
        complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
        failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get(COUNTED)]
        pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
        best = max((t.value for t in complete), default=None)
        seconds = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in (*complete, *pruned)
                      if t.datetime_start and t.datetime_complete)
        out.append(CellProgress(cell, count_finished(trials), len(complete), len(failed), best, len(pruned), seconds))
    return out


def dry_run_report(sweep: SweepSpec, paths: SweepPaths | None) -> dict:
    rows = progress(sweep, paths)
    runnable = [r for r in rows if r.cell.spec is not None]
    per_cell = sweep.search.trials_per_cell
    trials_runnable = per_cell * len(runnable)
    trials_done = sum(r.trials_complete + r.trials_failed + r.trials_pruned for r in runnable)
    unavailable: dict[str, int] = {}
    for r in rows:
        if r.cell.unavailable:
            unavailable[r.cell.unavailable] = unavailable.get(r.cell.unavailable, 0) + 1
    # the required trials, grouped by kind (``TrialKind.plan_group``: selectors, ear_trials), each group always there
    required_by_kind: dict[str, list] = {kind.plan_group: [] for kind in TRIAL_KINDS.values() if kind.plan_group}
    for required in requirements([r.cell.spec for r in runnable]):
        key = trial_key(required)
        users = sum(1 for r in runnable if key in r.cell.requirements)
        kind = kind_of(required)
        required_by_kind.setdefault(kind.plan_group or kind.name, []).append(
            {"name": required.name, "key": key, **kind.plan_row(required), "cells": users,
             "trained": kind.finished(required) is not None})
    required_trials = sum(len(rows) for rows in required_by_kind.values())
    return {
        "sweep": sweep.name,
        "cells": len(rows),
        "baseline_cells": sum(1 for r in rows if r.cell.is_baseline),
        "runnable_cells": len(runnable),
        "unavailable_cells": len(rows) - len(runnable),
        "unavailable_reasons": unavailable,
        "trials_per_cell": per_cell,
        "trials_planned": per_cell * len(rows),
        "trials_runnable": trials_runnable,
        "trials_done": trials_done,
        "trials_to_run": trials_runnable - trials_done,
        # per kind of required trial (supervised selectors; EAR trials whose runs the cells re-rank): each
        # trained once (a run of its kind) before the cells that use it
        **{field: value for group, rows in required_by_kind.items()
           for field, value in ((group, rows), (f"{group}_to_train", sum(1 for r in rows if not r["trained"])))},
        # the sweep's run + a run per cell (its child) + a run per trial (the cell's child) + required trials
        "mlflow_runs_planned": 1 + len(rows) + per_cell * len(rows) + required_trials,
        "mlflow_runs_runnable": 1 + len(runnable) + trials_runnable + required_trials,
        "cells_detail": [
            {"key": r.cell.key, **r.cell.axes, "searched": list(r.cell.searched), "baseline": r.cell.is_baseline,
             "unavailable": r.cell.unavailable, "trials_done": r.trials_complete + r.trials_failed + r.trials_pruned,
             "trials_pruned": r.trials_pruned, "trials_complete": r.trials_complete,
             "trial_seconds": round(r.trial_seconds, 3), "best": r.best}
            for r in rows
        ],
    }


def dry_run(sweep: SweepSpec, paths: SweepPaths | None, device: str | None = None, throughput=None,
            price_per_hour: float | None = None) -> dict:
    """The ``--dry-run`` report: :func:`dry_run_report`, its ``preflight`` and the compute
    ``estimate`` on the ``device`` throughput profile (the options checked before any work; the
    evaluation targets held out by their queries, an error naming the YAML line)."""
    profile = choose_profile(sweep, device, throughput)  # the options checked before any work
    check_targets(sweep, sweep.cells)  # by the queries of local collections too; nothing is prepared
    report = {**dry_run_report(sweep, paths), "preflight": preflight(sweep)}
    left = {d["key"]: max(0, report["trials_per_cell"] - d["trials_done"]) for d in report["cells_detail"]}
    report["estimate"] = estimate(sweep, profile, left, price_per_hour, compared=load_throughputs(throughput))
    return report


def preflight(sweep: SweepSpec) -> list[str]:
    """What would stop the sweep before it computes anything, found without preparing: each
    cell's kind's ``preflight`` (every distinct model, collection, GloVe and run file of its
    cells and zero-shot targets), then, offline, every prebuilt index name and what the workers'
    storage lacks (:func:`orchestrator.core.staging.staging_problems`). One line each."""
    problems: dict[str, None] = {}
    cells = [c for c in sweep.cells if c.spec is not None]
    seen: set[tuple] = set()
    for cell in cells:  # once per model and augmentation: a cell's other axes read no other inputs
        what = (cell.axes.get("model"), cell.axes.get("augmentation"))
        if what not in seen:
            seen.add(what)
            problems.update(dict.fromkeys(trial_preflight(cell.spec)))  # its required trials' too
    for target in (targets(cells[0].spec, sweep.zero_shot_targets) if cells and sweep.kind.grid.zero_shot else []):
        if target.spec.data.test_collection:
            problems.update(dict.fromkeys(p for p in trial_preflight(target.spec) if p not in problems))
    return list(dict.fromkeys([*problems, *staging_problems(sweep_specs(sweep))]))


def data_variants(cell: Cell, sweep: SweepSpec) -> list:
    """The cell's spec once per searched k_a (re-ranking) or n (EAR): each is a prepared set of
    its own (augmentations; expansions and their BM25 runs), which the trials would otherwise
    build themselves, concurrently and more than once."""
    for name in (p.name for p in sweep.kind.searched if p.prepares_data):  # (k_a, n: SearchedParameter.prepares_data)
        space = getattr(sweep.search, name)
        if name in cell.searched and space is not None:
            return [kind_of(cell.spec).apply_params(cell.spec, {name: value}) for value in space.choices]
    return [cell.spec]


def preparation_units(sweep: SweepSpec, cells: list[Cell]) -> list:
    """Each cell's data as one unit (:mod:`orchestrator.lifecycle.preparation`): its spec per searched
    k_a, every zero-shot target's data (a collection that cannot load fails now, not after the
    grid trained), its selector's data first."""
    return [trial_unit(cell.key, data_variants(cell, sweep), sweep.zero_shot_targets) for cell in cells if cell.spec is not None]


def experiment_description(sweep: SweepSpec, cells: list[Cell]) -> str:
    """The sweep's experiment description (MLflow shows it above the run list): what the grid
    is and how to compare it there."""
    grid = sweep.grid
    searched = sorted({name.rstrip("_") for cell in cells for name in cell.searched})
    source = sweep_file(sweep)
    lists = {name: value for name, value in grid if isinstance(value, list)}  # the grid's lists, whatever its kind
    shape = " x ".join(f"{len(value)} {name}" for name, value in lists.items())
    if any(cell.is_baseline for cell in cells):
        shape += ", baselines included"
    return "\n".join([
        f"**Sweep `{sweep.name}`**{f' ({source})' if source else ''}: {len(cells)} cells, "
        f"{sweep.search.trials_per_cell} Optuna trials each: {sweep.kind.described_as} trials, {shape}.",
        "",
        f"- Runs: one per cell (`{schema.KIND_TAG}` = `cell`, its winner tested), its trials nested under it.",
        f"- Params on cells and trials alike: {', '.join(schema.GRID_AXES)}; searched: {', '.join(searched) or 'none'} "
        "(a cell holds its winner's values).",
        f"- Compare the cells: filter `tags.{schema.KIND_TAG} = 'cell'`, select them, Compare; plot a param against "
        f"`{schema.stored_metric_name(schema.target_prefix(schema.TEST) + 'ndcg_at_10')}` (test) or "
        f"`{schema.stored_metric_name(schema.BEST_OBJECTIVE)}` (validation).",
        "- `orchestrate ui FILE` prints these links; `orchestrate report FILE` writes the paper table.",
    ])
