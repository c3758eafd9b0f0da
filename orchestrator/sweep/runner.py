"""``orchestrate sweep``: the grid x Optuna x Ray Tune x MLflow, resumable.

- Cells come from :func:`orchestrator.sweep.grid.expand_grid`; each has its own Optuna study
  (:mod:`orchestrator.sweep.search`) in ``<storage>/<sweep>/optuna.db``.
- One Tune run per invocation holds every remaining trial of every cell (one scheduling
  pool). Each Tune trial trains the cell's trial spec as Ray Train workers, named by a
  stable Train run name, so a retried or resumed trial continues from its last epoch
  checkpoint; it chooses its epoch with the lifecycle's rule and reports it.
- MLflow (written by the driver only, see :mod:`orchestrator.core.tracking`): one
  experiment per sweep, a sweep run, a run per cell and a run per trial, found again by
  identity on every rerun.
- Each distinct supervised selector (``linear``/``attention`` augmentation) is trained once
  with :func:`~orchestrator.core.lifecycle.ensure_requirement` in the same Ray cluster, all
  of them at once beside the search (each with its own resources), tracked as a ``selector``
  run under the sweep run; a cell's trials wait only for its own selector, cells that need
  none start at once, and a failed selector fails only its cells. A rerun reuses a trained
  one and resumes a half-trained one.
- After the search, each cell's winner is evaluated on every target with the lifecycle's
  :func:`~orchestrator.core.lifecycle.submit_evaluations` and
  :func:`~orchestrator.core.lifecycle.log_target` on the cell run, which is then FINISHED.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.lifecycle import (
    ensure_requirement,
    requirement_run_key,
    requirements_needed,
    submit_evaluations,
    targets,
    test_data_identity,
    timing,
    training_data_identity,
    training_summary,
)
from orchestrator.core.tracking import Tracker, check_sqlite_file, mark_pruned
from orchestrator.sweep.grid import Cell, SweepSpec, check_targets, expand_grid, sweep_file
from orchestrator.sweep.progress import SweepProgress
from orchestrator.sweep.retention import checkpoint_disk_use, keep_winners
from orchestrator.sweep.search import (
    COUNTED,
    FAILURE,
    PRUNED_AT,
    TRAIN_RUN,
    CellStudiesSearcher,
    apply_params,
    count_finished,
    finished_trials,
    optuna_storage,
    requeue_interrupted,
    stop_file,
)
from orchestrator.sweep.store import LOCK_FILE, claim_store, experiment_owner, record_owner, write_record
from workloads.errors import InputError
from workloads.logs import configure as configure_logging
from workloads.logs import get_logger

log = get_logger("sweep")

# Test hook (never set in production): a comma-separated list of cell keys whose trials raise
# on purpose, each attempt appended to <storage>/failed_attempts.log. Read here only.
FAIL_CELLS_ENV = "ORCHESTRATE_TEST_FAIL_CELLS"


@dataclass(frozen=True)
class SweepPaths:
    root: Path

    @property
    def optuna_url(self) -> str:
        return f"sqlite:///{self.root / 'optuna.db'}"

    @property
    def ray_storage(self) -> Path:
        return self.root / "ray"

    @property
    def log_file(self) -> Path:
        """Ray's and Tune's own output, and every worker's, when the terminal shows the progress display."""
        return self.root / "sweep.log"


def sweep_paths(sweep: SweepSpec, storage_root: Path) -> SweepPaths:
    """Where the sweep's state lives (nothing is created: the sweep itself creates it)."""
    return SweepPaths(Path(storage_root).resolve() / sweep.name)


# ----------------------------------------------------------------------------- plan


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
    import optuna

    cells = expand_grid(sweep)
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
    from workloads.kinds import kind_of

    selectors, ear_trials = [], []
    for required in requirements_needed([r.cell.spec for r in runnable]):
        key = requirement_run_key(required)
        users = sum(1 for r in runnable if key in _requirements_of(r.cell))
        trained = kind_of(required).finished(required) is not None
        if kind_of(required).name == "ear":
            ear_trials.append({"name": required.name, "key": key, "reranker": required.ear.reranker,
                               "expansion": f"{required.expansion.source}-{required.expansion.n}",
                               "model": required.model.name, "cells": users, "trained": trained})
            continue
        selectors.append({"name": required.name, "key": key, "method": required.method,
                          "model": required.model.name, "size": str(required.training_data.size),
                          "data": required.selector.data, "k": required.selector.k, "cells": users, "trained": trained})
    requirements = len(selectors) + len(ear_trials)
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
        # supervised selectors: each trained once (a run of kind selector) before the cells that use it
        "selectors": selectors,
        "selectors_to_train": sum(1 for s in selectors if not s["trained"]),
        # EAR trials whose runs the cells re-rank (first_stage method ear): each trained once, first
        "ear_trials": ear_trials,
        "ear_trials_to_train": sum(1 for e in ear_trials if not e["trained"]),
        # the sweep's run + a run per cell (its child) + a run per trial (the cell's child) + required trials
        "mlflow_runs_planned": 1 + len(rows) + per_cell * len(rows) + requirements,
        "mlflow_runs_runnable": 1 + len(runnable) + trials_runnable + requirements,
        "cells_detail": [
            {"key": r.cell.key, **r.cell.axes, "searched": list(r.cell.searched), "baseline": r.cell.is_baseline,
             "unavailable": r.cell.unavailable, "trials_done": r.trials_complete + r.trials_failed + r.trials_pruned,
             "trials_pruned": r.trials_pruned, "trials_complete": r.trials_complete,
             "trial_seconds": round(r.trial_seconds, 3), "best": r.best}
            for r in rows
        ],
    }


def preflight(sweep: SweepSpec) -> list[str]:
    """What would stop the sweep before it computes anything, found without preparing (see
    :func:`~orchestrator.core.lifecycle.preflight_trial`): every distinct model, collection,
    GloVe and run file of its cells and zero-shot targets. One line each."""
    from orchestrator.core.lifecycle import ear_preflight, preflight_trial

    problems: dict[str, None] = {}
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    seen: set[tuple] = set()
    for cell in cells:
        spec = cell.spec
        if sweep.is_ear:
            what = (spec.model.name,)
            checks = ear_preflight
        else:
            what = (spec.model.name, spec.augmentation.glove_path, spec.augmentation.selector)
            checks = preflight_trial
        if what not in seen:
            seen.add(what)
            problems.update(dict.fromkeys(checks(spec)))
    for target in (targets(cells[0].spec, _zero_shot(sweep)) if cells and not sweep.is_ear else []):
        data = target.spec.data
        if data.test_collection:
            problems.update(dict.fromkeys(p for p in preflight_trial(target.spec) if p not in problems))
    return list(problems)


# ----------------------------------------------------------------------------- one Tune trial


def _sweep_trial(config: dict) -> None:
    """One Tune trial: the cell's trial as Ray Train workers, reported to Tune per epoch, then
    the chosen epoch (the lifecycle's rule) and the training summary."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from orchestrator.core.execution import epoch_results, make_trainer
    from workloads.kinds import TRIAL_KINDS
    from workloads.trial import choose_epoch

    configure_logging()  # the driver's level, from the environment
    kind = TRIAL_KINDS[config.get("kind", "rerank")]  # (a trial config written before cells had kinds: re-ranking)
    spec = kind.spec.model_validate(config["spec"])
    if config["cell"] in os.environ.get(FAIL_CELLS_ENV, "").split(","):  # test hook, see FAIL_CELLS_ENV
        with open(Path(config["storage"]) / "failed_attempts.log", "a") as attempts:
            attempts.write(config["train_run"] + "\n")
        raise RuntimeError(f"{FAIL_CELLS_ENV}: this trial raises on purpose")
    prepared = kind.prepare(spec)  # cached by content: the driver prepared every k_a (every n of EAR)
    pruned = stop_file(config["storage"], config["train_run"])
    trainer = make_trainer(spec, kind.worker_inputs(prepared), Path(config["storage"]), config["train_run"],
                           [TuneReportCallback()], stop_file=pruned)
    started = time.perf_counter()
    try:
        result = trainer.fit()
    except Exception as exc:  # a deterministic out-of-memory is recorded, not retried blindly
        if _is_out_of_memory(exc):
            ray.tune.report({"failure": "oom", schema.OBJECTIVE: float("nan")})  # Tune insists on the metric
            return
        raise
    epochs = epoch_results(result)
    if pruned.exists():  # stopped by its cell's pruner: an outcome, not a result (Tune insists on the metric)
        ray.tune.report({PRUNED_AT: max((int(e.metrics["epoch"]) for e in epochs), default=0),
                         schema.OBJECTIVE: max((e.metrics[schema.OBJECTIVE] for e in epochs), default=float("nan"))})
        return
    metrics = [e.metrics for e in epochs]
    summary = training_summary(metrics)
    best = epochs[choose_epoch(metrics)]
    ray.tune.report({**summary, **timing(time.perf_counter() - started, summary), schema.OBJECTIVE: best.metrics[schema.OBJECTIVE],
                     "final": 1, schema.CHECKPOINT_TAG: best.checkpoint})


# What Ray's memory monitor says when it kills a worker because its node runs low on memory
# (the raylet's message; ray.exceptions.OutOfMemoryError carries it): other processes' memory
# counts too, so the same trial may well fit on a retry.
MEMORY_MONITOR_MARKERS = ("running low on memory", "Memory on the node (IP:")


def _failures(exc: BaseException):
    """``exc`` and what it wraps: causes, Ray Train's per-worker failures, a controller's failure."""
    seen, pending = set(), [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        yield error
        pending += [error.__cause__, error.__context__, getattr(error, "controller_failure", None)]
        pending += list((getattr(error, "worker_failures", None) or {}).values())


def _is_memory_monitor_kill(exc: BaseException) -> bool:
    """A worker killed by Ray's memory monitor (retryable), not a step that does not fit."""
    from ray.exceptions import OutOfMemoryError

    return any(isinstance(error, OutOfMemoryError) or any(m in str(error) for m in MEMORY_MONITOR_MARKERS)
               for error in _failures(exc))


def _is_out_of_memory(exc: BaseException) -> bool:
    """A deterministic out-of-memory: the trial's own allocation failed (``StepOutOfMemoryError``,
    CUDA's, the host's ``MemoryError``), recorded as ``failure=oom`` and not retried. A worker
    the memory monitor killed is not one: it raises, and Tune retries it (``max_failures``)."""
    if _is_memory_monitor_kill(exc):
        return False
    text = "\n".join(f"{type(error).__name__}: {error}" for error in _failures(exc))
    return any(marker in text for marker in ("OutOfMemoryError", "CUDA out of memory", "MemoryError"))


# ----------------------------------------------------------------------------- the sweep


def _cell_runs(tracker: Tracker, experiment_id: str, sweep: SweepSpec, cells: list[Cell]) -> dict[str, str]:
    """Find or create the run of every runnable cell under the sweep run."""
    root = tracker.sweep_run(experiment_id, sweep.name)
    tracker.client.update_run(root, status="RUNNING")
    tracker.resumed(root)
    runs = {cell.key: tracker.cell_run(experiment_id, sweep.name, cell.key,
                                       {**cell.axes, "collection": cell.spec.data.collection, **cell.tags},
                                       cell.is_baseline, {"axes": cell.axes, "searched": list(cell.searched),
                                                          "spec": cell.spec.model_dump(mode="json", by_alias=True)})
            for cell in cells}
    for cell in cells:  # the grid axes as params too (stores written before cells had params gain them)
        tracker.log_new_params(runs[cell.key], schema.comparison_params(cell.axes, {}))
    for run_id in runs.values():  # cells an interrupted or failed run left: worked on again now
        run = tracker.client.get_run(run_id)
        if run.info.status in ("KILLED", "FAILED"):
            tracker.client.update_run(run_id, status="RUNNING")
            tracker.resumed(run_id)
    return runs


def migrate_trial_axes(tracker: Tracker, experiment_id: str, cell_runs: dict[str, str]) -> int:
    """Give trial runs written before one axis vocabulary (``augmentation=bm25-k2``) their
    cell's axis tags; returns how many runs changed. Idempotent."""
    cell_tags = {key: tracker.client.get_run(run_id).data.tags for key, run_id in cell_runs.items()}
    changed = 0
    for run in tracker.runs_of_kind(experiment_id, schema.TRIAL):
        tags = cell_tags.get(run.data.tags.get(schema.CELL_TAG))
        if tags is None:
            continue
        stale = {a: tags[a] for a in schema.AXES if a in tags and run.data.tags.get(a) != tags[a]}
        if stale:
            tracker.set_tags(run.info.run_id, stale)
            changed += 1
    return changed


def reconcile_trial_runs(tracker: Tracker, experiment_id: str, searcher: CellStudiesSearcher) -> int:
    """Close trial runs a killed driver left open after their Optuna trial had ended (Tune tells
    the searcher before the callbacks): COMPLETE -> FINISHED, a counted FAIL -> FAILED.
    Returns how many were closed."""
    import optuna

    # one query for every open trial run, not one per Optuna trial (a grid has thousands)
    open_runs = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in tracker.runs_of_kind(experiment_id, schema.TRIAL)
                 if r.info.status == "RUNNING"}
    closed = 0
    for cell_key, study in searcher.studies.items():
        for trial in study.get_trials(deepcopy=False):
            if trial.state == optuna.trial.TrialState.PRUNED:
                run = open_runs.get(f"{cell_key}/{trial.user_attrs.get(TRAIN_RUN)}")
                if run is not None:
                    mark_pruned(tracker, run.info.run_id, trial.user_attrs.get(PRUNED_AT, 0))
                    closed += 1
                continue
            done = trial.state == optuna.trial.TrialState.COMPLETE
            if not (done or (trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs.get(COUNTED))):
                continue
            run = open_runs.get(f"{cell_key}/{trial.user_attrs.get(TRAIN_RUN)}")
            if run is None:
                continue
            if done:
                if schema.BEST_OBJECTIVE not in run.data.metrics:
                    tracker.log_metrics(run.info.run_id, {schema.BEST_OBJECTIVE: trial.value})
                tracker.finish(run.info.run_id, "FINISHED")
            else:
                tracker.fail(run.info.run_id, trial.user_attrs.get(FAILURE, "error"))
            closed += 1
    return closed


def _max_concurrent(sweep: SweepSpec, cells: list[Cell], max_concurrent: int | None = None) -> tuple[int, str]:
    """Trials in flight at once, and why: ``--max-concurrent`` (``max_concurrent``), else
    ``search.max_concurrent_trials``, else what the cluster holds at its largest
    (:func:`~orchestrator.core.execution.trial_capacity`, the autoscaler's limits where there is
    one), for the most demanding cell's trial shape. Where the autoscaler's limits cannot be
    read, the live nodes are no answer (GPU workers scaling from 0 are not live yet, and a sweep
    capped at the nodes that are up never asks for more): one line asking for either setting."""
    from orchestrator.core.execution import limits_unreadable, trial_capacity

    given = ((max_concurrent, "--max-concurrent") if max_concurrent else
             (sweep.search.max_concurrent_trials, "search.max_concurrent_trials") if sweep.search.max_concurrent_trials else None)
    if given:
        unreadable = limits_unreadable()
        return given if unreadable is None else (given[0], f"{given[1]}; the autoscaler's limits could not be read: {unreadable}")
    capacity = min((trial_capacity(cell.spec) for cell in _distinct_shapes(cells)), key=lambda c: c.trials)
    if capacity.unreadable:
        raise InputError(sweep_file(sweep) or sweep.name,
                         f"the autoscaler's limits could not be read ({capacity.unreadable}): set search.max_concurrent_trials "
                         "or pass --max-concurrent N (trials in flight at once)")
    return capacity.trials, capacity.source


def _distinct_shapes(cells: list[Cell]) -> list[Cell]:
    shapes: dict = {}
    for cell in cells:
        shapes.setdefault(cell.spec.resources, cell)
    return list(shapes.values())


def _data_variants(cell: Cell, sweep: SweepSpec) -> list:
    """The cell's spec once per searched k_a (re-ranking) or n (EAR): each is a prepared set of
    its own (augmentations; expansions and their BM25 runs), which the trials would otherwise
    build themselves, concurrently and more than once."""
    for name in ("k", "n"):
        space = getattr(sweep.search, name)
        if name in cell.searched and space is not None:
            return [apply_params(cell.spec, {name: value}) for value in space.choices]
    return [cell.spec]


def _requirements_of(cell: Cell) -> list[str]:
    """The run keys of the trials a cell requires first: the selector it augments with, the EAR
    trial whose run it re-ranks."""
    return [requirement_run_key(r) for r in requirements_needed([cell.spec])] if cell.spec is not None else []


def _zero_shot(sweep: SweepSpec) -> list[tuple]:
    return [(t.collection, t.split, t.first_stage) for t in sweep.zero_shot]


@contextlib.contextmanager
def _noise_to(log_file: Path | None):
    """Send Ray's and Tune's output (config boxes, hints, raylet warnings, worker lines) to
    ``log_file`` while the block runs; None leaves it on the terminal (``--verbose``)."""
    if log_file is None:
        with contextlib.redirect_stdout(sys.stderr):  # never on stdout: --json stays parseable
            yield
        return
    ray_loggers = [logging.getLogger(name) for name in ("ray", "ray.tune", "ray.train", "ray.data")]
    with open(log_file, "a", buffering=1) as sink:
        saved = [(handler, handler.stream) for logger in ray_loggers for handler in logger.handlers
                 if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]
        for handler, _ in saved:
            handler.setStream(sink)
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                yield
        finally:
            for handler, stream in saved:
                handler.setStream(stream)


# ----------------------------------------------------------------------------- the store: whose, and who runs it


def bind_store(sweep: SweepSpec, paths: SweepPaths, tracker: Tracker | None = None, experiment=None) -> None:
    """Check, then record, which sweep file the storage (and the MLflow experiment) belongs to."""
    if record_owner(sweep, paths.root):
        write_record(sweep, paths.root)
    if tracker is not None and experiment is not None:
        if experiment_owner(sweep, tracker, experiment):
            tracker.client.set_experiment_tag(experiment.experiment_id, schema.SWEEP_FILE_TAG, str(sweep_file(sweep)))


def check_store_owner(sweep: SweepSpec, paths: SweepPaths, tracker: Tracker | None = None, experiment=None) -> None:
    """Read only: the storage and the MLflow experiment of this sweep's name belong to this
    sweep's file (or to none yet); another file's are one line (what ``status`` and ``reset``
    check before they read or remove anything). A store moved or copied with its sweep file
    belongs to the file beside it (:func:`~orchestrator.sweep.grid.check_owner`)."""
    if tracker is not None and experiment is not None:
        experiment_owner(sweep, tracker, experiment)
    record_owner(sweep, paths.root)


@contextlib.contextmanager
def sweep_lock(paths: SweepPaths):
    """One process runs a sweep at a time: a second one refuses with one line instead of racing
    the first for its trials (an exclusive ``flock`` on the storage's lock file, released when
    the process ends, however it ends)."""
    import fcntl
    import socket

    claim_store(paths.root, paths.root.name)  # never into a folder of the user's that has the sweep's name
    handle = open(paths.root / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise InputError(paths.root, f"the sweep is already running ({holder}): wait for it to end, or stop it first") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


# ----------------------------------------------------------------------------- the sweep


def run_sweep(sweep: SweepSpec, tracker: Tracker, storage_root: Path, ray_address: str | None = None,
              verbose: bool = False, max_concurrent: int | None = None) -> dict:
    """Run (or finish) the sweep; returns the dry-run report of the end state. Ctrl-C ends it
    within seconds: running trials stop and resume from their last checkpoint next time,
    nothing unfinished is marked finished, and :class:`Interrupted` says what is kept."""
    import ray

    from orchestrator.core.interrupts import interruptible

    # Ray forwards its workers' lines to this process asynchronously, so a line can arrive
    # after the call that caused it (the exit traceback of a reused Tune process came after
    # tuner.fit had returned, onto the terminal): Ray's output goes to the log file for the
    # whole sweep, and this process's Ray session ends inside, flushing what is left there.
    paths = sweep_paths(sweep, storage_root)
    with sweep_lock(paths), interruptible() as interruption, _noise_to(None if verbose else paths.log_file):
        try:
            return _run_sweep(sweep, tracker, paths, ray_address, verbose, interruption, max_concurrent)
        finally:
            if ray.is_initialized():
                ray.shutdown()


def preparation_units(sweep: SweepSpec, cells: list[Cell]) -> list:
    """Each cell's data as one unit (:mod:`orchestrator.core.preparation`): its spec per searched
    k_a, every zero-shot target's data (a collection that cannot load fails now, not after the
    grid trained), its selector's data first."""
    from orchestrator.core.preparation import trial_unit

    return [trial_unit(cell.key, _data_variants(cell, sweep), _zero_shot(sweep)) for cell in cells if cell.spec is not None]


def _prepare_cells(sweep: SweepSpec, cells: list[Cell], prepared: dict) -> None:
    """The cells' data (indexes, runs, training sets, augmentations), prepared once before the
    trials race for it (the units ``orchestrate prepare`` builds); ``prepared`` keeps each cell's."""
    from orchestrator.core.preparation import prepare_units
    from workloads.kinds import kind_of

    prepare_units(preparation_units(sweep, cells))
    for cell in (c for c in cells if c.spec is not None):
        variant = _data_variants(cell, sweep)[-1]
        prepared[cell.key] = kind_of(variant).prepare(variant)  # cached: read back, nothing computed


def _start_requirements(sweep: SweepSpec, supervised: list[Cell], tracker: Tracker, experiment_id: str, paths: SweepPaths,
                        ray_address: str | None, prepared: dict, cell_runs: dict[str, str], interruption) -> dict:
    """Each distinct required trial (a supervised selector, an EAR trial) trained once, tracked
    under the sweep run, all at once: each in a driver thread of its own, whose Ray Train
    workers ask for that trial's own resources (MLflow is still written by this process only).
    Once a cell's requirements are kept, its data is prepared (augmentations with the trained
    selector) and its trials may start; cells that need none do not wait for any. Returns cell
    key -> the Future the cell's trials wait for (its exception: why the cell cannot run)."""
    import threading
    from concurrent.futures import Future

    from orchestrator.core.execution import check_resources, init_ray
    from workloads.kinds import kind_of

    required = requirements_needed([c.spec for c in supervised])
    if not required:
        return {}
    root = tracker.sweep_run(experiment_id, sweep.name)
    init_ray(ray_address)
    for each in required:  # an EAR trial has resources of its own: refused before anything waits forever
        check_resources(each)

    def run(target, done: Future, *args) -> None:
        try:
            done.set_result(target(*args))
        except BaseException as exc:  # the Future carries it to whoever waits
            done.set_exception(exc)

    def train(each) -> Path:
        try:
            return ensure_requirement(each, tracker, experiment_id, paths.ray_storage, ray_address,
                                      tags={schema.PARENT_TAG: root, schema.SWEEP_TAG: sweep.name}, interrupted=interruption)
        except BaseException as exc:
            if not interruption.is_set():
                log.error("%s %s failed: %s", kind_of(each).name, each.name, _last_line(exc))
            raise

    trained: dict[str, Future] = {}
    for number, each in enumerate(required, 1):
        key = requirement_run_key(each)
        log.info("required trial %d/%d: %s %s (%s), trained beside the others", number, len(required), kind_of(each).name,
                 each.name, key)
        trained[key] = Future()
        threading.Thread(target=run, args=(train, trained[key], each), name=f"requirement-{number}", daemon=True).start()

    preparing = threading.Lock()  # cells' data shares inputs (indexes, runs): built by one thread at a time

    def prepare(users: list[Cell], needs: tuple[str, ...]) -> None:
        for key in needs:
            error = trained[key].exception()  # waits for it
            if error is not None:
                raise RuntimeError(f"its required trial {key} failed ({_last_line(error)}); "
                                   "run the sweep again to retry it") from error
        with preparing:
            _prepare_cells(sweep, users, prepared)
            _log_data_stats(tracker, cell_runs, users, prepared)

    groups: dict[tuple[str, ...], list[Cell]] = {}
    for cell in supervised:
        groups.setdefault(tuple(_requirements_of(cell)), []).append(cell)
    gates = {}
    for needs, users in groups.items():
        ready: Future = Future()
        threading.Thread(target=run, args=(prepare, ready, users, needs), daemon=True).start()
        gates |= {cell.key: ready for cell in users}
    return gates


def _last_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[-1]}" if text else type(error).__name__


def _wait_for_requirements(gates: dict, interruption) -> None:
    """Until every cell's requirements are kept or failed (the search may have ended without
    them: nothing left to run); Ctrl-C raises here."""
    from concurrent.futures import wait

    pending = set(gates.values())
    while pending and not interruption.is_set():
        _, pending = wait(pending, timeout=1)


def _log_data_stats(tracker: Tracker, cell_runs: dict[str, str], cells: list[Cell], prepared: dict) -> None:
    for cell in cells:  # the cell's data, logged once
        listed = tracker.run_artifacts(tracker.client.get_run(cell_runs[cell.key])).list_artifacts()
        if not any(a.path == "data_stats.json" for a in listed):
            tracker.log_json(cell_runs[cell.key], "", "data_stats.json", prepared[cell.key].data_stats)


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


def _run_sweep(sweep: SweepSpec, tracker: Tracker, paths: SweepPaths, ray_address: str | None, verbose: bool,
               interruption, max_concurrent: int | None = None) -> dict:
    from orchestrator.core.interrupts import Interrupted
    from workloads.kinds import kind_of

    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    if not cells:
        raise ValueError(f"sweep {sweep.name}: no cell has a workload yet")
    check_targets(sweep, cells)  # held out by their queries too, before anything is prepared
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    bind_store(sweep, paths, tracker, experiment)
    if (paths.root / "optuna.db").exists():
        check_sqlite_file(paths.root / "optuna.db", "Optuna storage")
    if experiment is not None:
        stale = stale_trials(tracker, experiment.experiment_id, cells)
        if stale:
            raise InputError(sweep_file(sweep) or sweep.name,
                             f"the training data changed since {len(stale)} finished trial(s) of this sweep ran (e.g. "
                             f"{stale[0]}): they describe other data; start afresh with `orchestrate reset`, or rename "
                             "the sweep (name:)")
    # a worker no node can hold would wait forever; limits that cannot be read need a setting
    concurrency = _check_cluster(sweep, cells, ray_address, max_concurrent)
    log.info("preparing data for %d cells", len(cells))
    for selector in requirements_needed([c.spec for c in cells]):
        kind_of(selector).prepare(selector)  # its data is known good before anything is written
    prepared: dict = {}
    supervised = [c for c in cells if _requirements_of(c)]  # prepared once their required trials are kept
    _prepare_cells(sweep, [c for c in cells if c not in supervised], prepared)

    # MLflow is written once every input is known good.
    experiment_id = tracker.experiment_id(sweep.name)
    bind_store(sweep, paths, tracker, tracker.client.get_experiment(experiment_id))
    tracker.client.set_experiment_tag(experiment_id, schema.NOTE_TAG, experiment_description(sweep, cells))
    try:
        return _search_and_test(sweep, tracker, experiment_id, cells, paths, ray_address, verbose, interruption,
                                supervised, prepared, concurrency)
    except InputError as exc:
        # A problem found only now (a selector's data, a zero-shot target) leaves no run RUNNING
        # that nothing runs: `status` would count it as running forever.
        close_open_runs(tracker, experiment_id, exc)
        raise
    except KeyboardInterrupt:  # before or between the steps that say what they keep themselves
        closed = close_open_runs(tracker, experiment_id)
        raise Interrupted(f"sweep {sweep.name} interrupted before its search ended: {closed} open run(s) marked "
                          "interrupted, nothing reported as complete; run the same command again to resume") from None


def experiment_description(sweep: SweepSpec, cells: list[Cell]) -> str:
    """The sweep's experiment description (MLflow shows it above the run list): what the grid
    is and how to compare it there."""
    grid = sweep.grid
    searched = sorted({name.rstrip("_") for cell in cells for name in cell.searched})
    source = sweep_file(sweep)
    shape = (f"EAR trials: {len(grid.models)} model(s) x {len(grid.rerankers)} reranker(s) ({', '.join(grid.rerankers)}; "
             f"the `loss` axis: ear-ri, ear-rd) x {len(grid.seeds)} seed(s), each winner kept." if sweep.is_ear else
             f"{len(grid.models)} model(s) x {len(grid.losses)} loss(es) x {len(grid.augmentations)} augmentation(s) x "
             f"{len(grid.sizes)} size(s) x {len(grid.seeds)} seed(s), plus a baseline per model, size and seed.")
    return "\n".join([
        f"**Sweep `{sweep.name}`**{f' ({source})' if source else ''}: {len(cells)} cells, "
        f"{sweep.search.trials_per_cell} Optuna trials each: {shape}",
        "",
        f"- Runs: one per cell (`{schema.KIND_TAG}` = `cell`, its winner tested), its trials nested under it.",
        f"- Params on cells and trials alike: {', '.join(schema.GRID_AXES)}; searched: {', '.join(searched) or 'none'} "
        "(a cell holds its winner's values).",
        f"- Compare the cells: filter `tags.{schema.KIND_TAG} = 'cell'`, select them, Compare; plot a param against "
        f"`{schema.stored_metric_name(schema.target_prefix(schema.TEST) + 'ndcg_at_10')}` (test) or "
        f"`{schema.stored_metric_name(schema.BEST_OBJECTIVE)}` (validation).",
        "- `orchestrate ui FILE` prints these links; `orchestrate report FILE` writes the paper table.",
    ])


def _check_cluster(sweep: SweepSpec, cells: list[Cell], ray_address: str | None,
                   max_concurrent: int | None = None) -> tuple[int, str]:
    """Every cell's workers fit on some node (of the live cluster, or of the autoscaler's node
    types), checked before any data is prepared or any run is written; returns the trials in
    flight at once and why (:func:`_max_concurrent`, which refuses now where it cannot know)."""
    from orchestrator.core.execution import check_resources, cluster_has_gpu, init_ray

    init_ray(ray_address)
    asks = {(c.spec.resources.cpus_per_worker, c.spec.resources.use_gpu): c.spec for c in cells}
    for spec in asks.values():  # one look at the cluster per distinct request, not per cell
        check_resources(spec)
    concurrency = _max_concurrent(sweep, cells, max_concurrent)
    if "could not be read" in concurrency[1]:
        auto = any(c.spec.resources.use_gpu == "auto" for c in cells) and not cluster_has_gpu()
        log.warning("up to %d trial(s) at a time from %s%s", *concurrency,
                    "; use_gpu: auto sees no live GPU, so the trials ask for none (use_gpu: true asks regardless)" if auto else "")
    return concurrency


def close_open_runs(tracker: Tracker, experiment_id: str, error: InputError | None = None) -> int:
    """Ends the sweep's, cells' and selectors' runs still RUNNING: FAILED with ``error``, else
    KILLED and tagged interrupted (Ctrl-C). Returns how many. Trial runs are left to their Optuna
    outcome (:func:`reconcile_trial_runs` on resume). Best effort: the error that brought us here
    is the one the user sees."""
    closed = 0
    with contextlib.suppress(Exception):
        for run in tracker.client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=50_000):
            if run.data.tags.get(schema.KIND_TAG, schema.TRIAL) == schema.TRIAL:
                continue
            if error is not None:
                tracker.fail(run.info.run_id, "error", error)
            else:
                tracker.set_tags(run.info.run_id, {schema.INTERRUPTED_TAG: "true"})
                tracker.finish(run.info.run_id, "KILLED")
            closed += 1
    return closed


def _search_and_test(sweep, tracker, experiment_id, cells, paths, ray_address, verbose, interruption, supervised,
                     prepared, concurrency: tuple[int, str] | None = None) -> dict:
    """Everything after the first MLflow write: selectors, cell runs, the search, the winners' tests."""
    from orchestrator.core.interrupts import Interrupted

    cell_runs = _cell_runs(tracker, experiment_id, sweep, cells)
    # the selectors (and EAR trials) train concurrently; their cells wait for them in the search
    gates = _start_requirements(sweep, supervised, tracker, experiment_id, paths, ray_address, prepared, cell_runs,
                                interruption)
    migrated = migrate_trial_axes(tracker, experiment_id, cell_runs)
    if migrated:
        log.info("%d trial run(s) of an earlier store now carry their cell's axis tags", migrated)
    _log_data_stats(tracker, cell_runs, [c for c in cells if c not in supervised], prepared)

    searcher = CellStudiesSearcher(cells, sweep.search, paths.optuna_url, interruption)
    searcher.gates = gates
    closed = reconcile_trial_runs(tracker, experiment_id, searcher)
    if closed:
        log.info("%d trial run(s) left open by a killed driver were closed from their Optuna outcome", closed)
    requeued = sum(requeue_interrupted(s) for s in searcher.studies.values())
    if requeued:
        log.info("%d trial(s) interrupted by a previous driver will resume from their checkpoints", requeued)
    remaining = searcher.remaining()
    display = SweepProgress(sweep.name, {c.key: finished_trials(searcher.studies[c.key]) for c in cells},
                            sweep.search.trials_per_cell, enabled=not verbose)
    if remaining:
        _search(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, searcher, display,
                interruption, remaining, concurrency)
    _wait_for_requirements(gates, interruption)
    if interruption.is_set():
        summary = mark_interrupted(tracker, experiment_id, sweep, searcher, cell_runs)
        close_open_runs(tracker, experiment_id)  # required trials still training: resumed next time
        raise Interrupted(summary)
    blocked = {key: gate.exception() for key, gate in gates.items() if gate.exception() is not None}
    for cell in cells:  # a failed requirement fails its own cells only
        if cell.key in blocked:
            log.error("%s: not run, %s", cell.key, blocked[cell.key])
            tracker.fail(cell_runs[cell.key], "requirement", blocked[cell.key])
    tested = [c for c in cells if c.key not in blocked]
    try:
        first_stage_validation = {cell.key: prepared[cell.key].first_stage_validation for cell in tested}
        _evaluate_winners(sweep, tracker, experiment_id, tested, cell_runs, paths, ray_address, first_stage_validation)
    except KeyboardInterrupt:
        raise Interrupted(mark_interrupted(tracker, experiment_id, sweep, searcher, cell_runs)) from None
    root = tracker.sweep_run(experiment_id, sweep.name)
    tracker.finish(root)  # every cell is FINISHED or FAILED now
    from orchestrator.sweep.statistics import log_cell_statistics

    log_cell_statistics(sweep, tracker, experiment_id)  # seeds' spread and intervals on the cell runs, for the UI
    log_default_report(sweep, tracker)
    return dry_run_report(sweep, paths)


class _InterruptStopper:
    """Ends the Tune run once the command is interrupted (Tune stops its trials and returns)."""

    def __new__(cls, interruption):
        from ray.tune import Stopper

        class InterruptStopper(Stopper):
            def __call__(self, trial_id, result):
                return False

            def stop_all(self):
                return interruption.is_set()

        return InterruptStopper()


def _search(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, searcher, display, interruption,
            remaining, concurrency: tuple[int, str] | None = None) -> None:
    """The Tune run of every remaining trial (one scheduling pool); returns early when interrupted."""
    import ray.tune

    from orchestrator.core.execution import init_ray
    from orchestrator.sweep.trial_logger import MlflowTrialLogger

    init_ray(ray_address)
    concurrent, why = concurrency or _max_concurrent(sweep, cells)
    log.info("%d trial(s) to run, up to %d at a time (%s)%s", remaining, concurrent, why.split(";")[0],
             "" if verbose else f"; Ray's own output goes to {paths.log_file}")
    display.concurrency = concurrent
    searcher.extra_config = {"storage": str(paths.ray_storage)}
    tuner = ray.tune.Tuner(
        # The Train workers hold the trial's CPUs and GPUs. The Tune trial itself reserves a
        # little memory, not a CPU fraction: 0.01 CPU per trial leaves no node a whole CPU
        # for a 1-CPU worker (a deadlock on 1-CPU nodes, one trial at a time on 2 CPUs).
        ray.tune.with_resources(_sweep_trial, {"cpu": 0, "memory": 64 * 1024**2}),
        # Autoscaler demand: each trial in flight asks for its workers' CPUs and GPUs (Ray
        # Train's placement group); a request no live node can hold stays pending, and pending
        # requests are what Ray's autoscaler (v1, v2, KubeRay's) starts nodes for. So the cap
        # is the cluster at its largest or a number the user set, never the live nodes: capped
        # at those, no trial would ever wait and the cluster would never grow.
        # reuse_actors: the next trial runs in a finished trial's Tune process, which has
        # already imported Ray Train, torch and our modules; a fresh process per trial
        # cost ~4 s more per trial here (README "Performance", "Tune trial processes").
        tune_config=ray.tune.TuneConfig(search_alg=searcher, num_samples=remaining,
                                        max_concurrent_trials=concurrent, reuse_actors=True),
        run_config=ray.tune.RunConfig(
            name=f"tune-{int(time.time())}", storage_path=str(paths.ray_storage),
            failure_config=ray.tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[MlflowTrialLogger(tracker, experiment_id, cell_runs, sweep, display, searcher, interruption)],
            stop=_InterruptStopper(interruption),
            verbose=0,
        ),
    )
    # Tune's own SIGINT handler would take the first Ctrl-C from ours; ours ends the run the
    # same way (its stopper), and knows the command was interrupted.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    with interruption.graceful(lambda: None):  # the stopper ends the Tune run at its next step
        tuner.fit()
    display.close()


def mark_interrupted(tracker: Tracker, experiment_id: str, sweep: SweepSpec, searcher: CellStudiesSearcher,
                     cell_runs: dict[str, str]) -> str:
    """After Ctrl-C: every run that did not finish is KILLED and tagged interrupted (never
    FINISHED); Optuna trials that were running stay RUNNING, so the next run resumes them from
    their checkpoints. Returns the line that says what is kept."""
    tags = {schema.INTERRUPTED_TAG: "true"}
    for run in tracker.runs_of_kind(experiment_id, schema.TRIAL):
        if run.info.status == "RUNNING":
            tracker.set_tags(run.info.run_id, tags)
            tracker.finish(run.info.run_id, "KILLED")
    for run_id in cell_runs.values():
        if tracker.client.get_run(run_id).info.status == "RUNNING":
            tracker.set_tags(run_id, tags)
            tracker.finish(run_id, "KILLED")
    root = tracker.sweep_run(experiment_id, sweep.name)
    tracker.set_tags(root, tags)
    tracker.finish(root, "KILLED")
    finished = sum(finished_trials(study) for study in searcher.studies.values())
    planned = sweep.search.trials_per_cell * len(searcher.studies)
    done = sum(1 for run_id in cell_runs.values() if tracker.client.get_run(run_id).info.status == "FINISHED")
    return (f"sweep {sweep.name} interrupted: {finished} of {planned} trials ended and are kept, {done} of {len(cell_runs)} "
            f"cells tested; run the same command again to resume (running trials go on from their last checkpoint)")


def _evaluate_winners(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address,
                      first_stage_validation: dict[str, dict[str, float]]) -> None:
    """Test every cell's winner (its best trial over all its trials) on every target with the
    lifecycle, all evaluations in flight at once. A cell already tested is tested again when its
    winner is no longer its best trial or its test data changed."""
    import optuna

    from orchestrator.core.execution import init_ray
    from orchestrator.core.lifecycle import log_target

    pending = []  # (cell, cell run id, winner, complete trials, winner's trial run, [PendingEvaluation], test data)
    for cell in cells:
        run_id = cell_runs[cell.key]
        study = optuna.load_study(study_name=cell.key, storage=optuna_storage(paths.optuna_url))
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            if f"{schema.first_stage_prefix('val')}ndcg_at_10" not in tracker.run_metrics(run_id):  # the reference still
                tracker.log_metrics(run_id, first_stage_validation[cell.key], prefix=schema.first_stage_prefix("val"))
            tracker.fail(run_id, "all trials failed")
            continue
        winner = max(complete, key=lambda t: t.value)
        child = tracker.find_run(experiment_id, f"{cell.key}/{winner.user_attrs[TRAIN_RUN]}")
        spec = apply_params(cell.spec, winner.params)
        evaluation_targets = targets(spec, _zero_shot(sweep))
        test_data = test_data_identity(evaluation_targets)
        run = tracker.client.get_run(run_id)
        if run.info.status == "FINISHED":
            same_winner = run.data.tags.get(schema.WINNER_TAG) == child.info.run_id
            same_data = run.data.tags.get(schema.TEST_DATA_TAG, test_data) == test_data
            if same_winner and same_data:  # evaluated by an earlier invocation
                tracker.log_new_params(run_id, schema.comparison_params(cell.axes, winner.params))  # (older stores)
                continue
            log.info("%s: testing again (%s)", cell.key, "its test data changed" if same_winner else
                     f"its best trial is now trial {winner.number}")
            previous = run.data.tags.get(schema.WINNER_TAG)
            if previous and previous != child.info.run_id:
                tracker.set_tags(previous, {schema.WINNER_TAG: "false"})
            tracker.client.update_run(run_id, status="RUNNING")
        init_ray(ray_address)
        try:
            jobs = submit_evaluations(spec, evaluation_targets, child.data.tags[schema.CHECKPOINT_TAG],
                                      child.data.metrics.get(f"{schema.BEST_PREFIX}{schema.TUNED_WEIGHT}"),
                                      chosen_metrics(child.data.metrics))
        except Exception as exc:
            tracker.fail(run_id, "evaluation", exc)
            raise
        pending.append((cell, run_id, winner, complete, child, jobs, test_data))
    if pending:
        log.info("testing the winners of %d cells (%d evaluations)", len(pending), sum(len(p[5]) for p in pending))
    for cell, run_id, winner, complete, child, jobs, test_data in pending:
        try:
            results = [job.result() for job in jobs]
            for result in results:
                log_target(tracker, run_id, result, run_tag=f"rerank-lab.{sweep.name}.{cell.key}")
            _keep_winner(tracker, run_id, apply_params(cell.spec, winner.params), child, results[0].reranking)
        except Exception as exc:  # never left RUNNING: a rerun evaluates a FAILED cell again
            tracker.fail(run_id, "evaluation", exc)
            raise
        # after the test measures: MLflow's compare page plots a cell's first metric by default
        tracker.log_metrics(run_id, {schema.BEST_OBJECTIVE: winner.value, schema.TRIALS_COMPLETE: len(complete)})
        if f"{schema.first_stage_prefix('val')}ndcg_at_10" not in tracker.run_metrics(run_id):
            tracker.log_metrics(run_id, first_stage_validation[cell.key], prefix=schema.first_stage_prefix("val"))
        tracker.set_tags(run_id, {schema.WINNER_TAG: child.info.run_id, schema.WINNER_PARAMS_TAG: str(winner.params),
                                  schema.TEST_DATA_TAG: test_data})
        tracker.set_tags(child.info.run_id, {schema.WINNER_TAG: "true"})
        kept = tracker.log_new_params(run_id, schema.comparison_params(cell.axes, winner.params))
        if kept:  # a new winner (more trials per cell): MLflow keeps a param's first value
            log.warning("%s: the cell run's params keep the first winner's %s; the new winner's values are in its tag %s",
                        cell.key, ", ".join(f"{k}={v}" for k, v in kept.items()), schema.WINNER_PARAMS_TAG)
        tracker.finish(run_id, "FINISHED")
        test = tracker.run_metrics(run_id)[f"{schema.target_prefix(schema.TEST)}ndcg_at_10"]
        log.info("%s (%s): winner trial %d val nDCG@10 %.4f, test nDCG@10 %.4f", cell.key, "/".join(cell.axes.values()),
                 winner.number, winner.value, test)
    keep_winners(sweep, tracker, cells, cell_runs, paths.ray_storage, paths.optuna_url)


def chosen_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A trial run's chosen epoch as the epoch's own metrics (``best_val_*`` -> ``val_*``)."""
    chosen = {k.removeprefix(schema.BEST_PREFIX): v for k, v in metrics.items()
              if k.startswith(f"{schema.BEST_PREFIX}{schema.VALIDATION_PREFIX}")}
    return {"epoch": metrics[schema.BEST_EPOCH], **chosen} if schema.BEST_EPOCH in metrics else chosen


def _keep_winner(tracker: Tracker, run_id: str, spec, child, tested) -> None:
    """A cell winner of a kind that keeps its result (an EAR trial: its reranker and the run of
    its chosen expansions) is kept as the trial of its parameters would be: ``orchestrate run``
    of that trial reuses it, a re-ranking trial with ``first_stage: {method: ear, run: FILE}``
    re-ranks its run. The cell run holds that trial file (``ear_trial.yaml``) and the test
    comparison (``ear_comparison.json``: BM25, RM3, first, concatenated, EAR, oracle)."""
    import ray
    import yaml

    from orchestrator.core.execution import submit_task
    from workloads.kinds import kind_of, result_summary

    kind = kind_of(spec)
    if not kind.result_file:  # re-ranking cells keep their checkpoints only (storage.keep)
        return
    kept = kind.finished(spec)
    if kept is None:
        log.info("keeping %s's winner (%s)", spec.name, kind.name)
        summary = {**result_summary(chosen_metrics(child.data.metrics), tested),
                   **{k: v for k, v in child.data.metrics.items() if k.startswith("time_")}}
        kept = ray.get(submit_task(spec, kind.keep, spec, Path(child.data.tags[schema.CHECKPOINT_TAG]), summary))
    else:  # the same identity trained before (another run or sweep): its result is what later trials read
        earlier = json.loads((kept / kind.result_file).read_text()).get("test_ndcg_at_10")
        now = tested.evaluation.aggregate["ndcg_at_10"]
        if earlier is None or abs(earlier - now) > 1e-6:
            log.warning("%s: its winner's identity was kept before (%s, test nDCG@10 %s); this winner tests at %.4f: "
                        "trials that read the kept result read that one", spec.name, kept, earlier, now)
        else:
            log.info("%s: its winner's identity was kept before (%s): reused", spec.name, kept)
    tracker.set_tags(run_id, {schema.KEPT_TAG: str(kept)})
    if kind.name == "ear":
        from workloads.expansion.comparison import ear_comparison

        tracker.log_text(run_id, yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), "ear_trial.yaml")
        tracker.log_json(run_id, "", "ear_comparison.json", {
            row.name: {"metrics": row.evaluation.aggregate, "p_value_vs_bm25": row.p_vs_bm25, "p_value_vs_rm3": row.p_vs_rm3}
            for row in ear_comparison(spec)})


def log_default_report(sweep: SweepSpec, tracker: Tracker) -> None:
    """The finished sweep's report (the default table, its figures) on the sweep run, where the
    MLflow UI shows it; ``orchestrate report`` writes there only when asked (``--log``)."""
    import tempfile

    from orchestrator.report.build import ReportRequest, build_report
    from orchestrator.report.tables import TableOptions

    try:
        with tempfile.TemporaryDirectory() as out:
            build_report([sweep], tracker, Path(out), ReportRequest(options=TableOptions(), log_to_mlflow=True))
    except InputError as exc:  # a report that cannot be made leaves the results as they are
        log.warning("the sweep's report was not logged to MLflow: %s", exc)


def _cell_states(sweep: SweepSpec, tracker: Tracker | None, plan: dict, trials: list) -> dict[str, str]:
    """Each runnable cell's one state: done, failed, stale, interrupted, running or pending."""
    results = {c.cell.key: c for c in load_cell_states(sweep, tracker)} if tracker is not None else {}
    begun = {d["key"] for d in plan["cells_detail"] if d["trials_done"]}
    begun |= {r.data.tags.get(schema.CELL_TAG) for r in trials if r.info.status == "RUNNING"}
    states = {}
    for detail in plan["cells_detail"]:
        if detail["unavailable"]:
            continue
        result = results.get(detail["key"])
        state = {"ok": "done", "failed": "failed", "stale": "stale", "interrupted": "interrupted"}.get(
            result.status if result is not None else "", None)
        states[detail["key"]] = state or ("running" if detail["key"] in begun else "pending")
    return states


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
        # 1,020 runs, 3 s per search), which Optuna counts.
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
        "failed_trials": [f"{r.info.run_name} ({r.data.tags.get(schema.CELL_TAG)}): {r.data.tags.get(schema.FAILURE_TAG, '?')} "
                          f"{r.data.tags.get(schema.ERROR_TAG, '')}".strip() for r in by_status["FAILED"]],
    }


def load_cell_states(sweep: SweepSpec, tracker: Tracker):
    """Every cell with its MLflow state (the report's reading: ok, failed, stale, interrupted, ...)."""
    from orchestrator.report.results import load_sweep_results

    return load_sweep_results(sweep, tracker).cells
