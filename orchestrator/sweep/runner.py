"""``orchestrate sweep``: the grid x Optuna x Ray Tune x MLflow, resumable; this module is the
sequence, each step lives in its own module.

- Cells come from the loaded sweep (:attr:`~orchestrator.sweep.grid.SweepSpec.cells`, its grid expanded once); each has its own Optuna study
  (:mod:`orchestrator.sweep.search`) in ``<storage>/<sweep>/optuna.db``
  (:mod:`orchestrator.sweep.store`: whose it is, who runs it).
- Before anything is written: the plan (:mod:`orchestrator.sweep.dry_run`), stale trials
  (:mod:`orchestrator.sweep.status`), the cluster's room (:mod:`orchestrator.sweep.tune`), the
  cells' data.
- One Tune run per invocation holds every remaining trial of every cell (one scheduling
  pool, :mod:`orchestrator.sweep.tune`).
- MLflow (written by the driver only, see :mod:`orchestrator.core.tracking`): one
  experiment per sweep, a sweep run, a run per cell and a run per trial, found again by
  identity on every rerun.
- Each distinct supervised selector (``linear``/``attention`` augmentation) is trained once
  with :func:`~orchestrator.lifecycle.run.ensure_requirement` in the same Ray cluster, all
  of them at once beside the search (each with its own resources), tracked as a ``selector``
  run under the sweep run; a cell's trials wait only for its own selector, cells that need
  none start at once, and a failed selector fails only its cells. A rerun reuses a trained
  one and resumes a half-trained one.
- After the search, each cell's winner is tested (:mod:`orchestrator.sweep.winners`) and the
  seeds' statistics logged (:func:`orchestrator.sweep.winners.log_cell_statistics`); ``on_finished`` (the command's
  report) runs last.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path

import ray

from orchestrator.core import schema
from orchestrator.core.execution import check_resources, init_ray
from orchestrator.core.interrupts import Interrupted, interruptible
from orchestrator.core.tracking import Tracker, check_sqlite_file
from orchestrator.lifecycle.identity import trial_key
from orchestrator.lifecycle.preparation import prepare_units
from orchestrator.lifecycle.run import ensure_requirement
from orchestrator.sweep.dry_run import data_variants, dry_run_report, experiment_description, preparation_units
from orchestrator.sweep.grid import Cell, SweepSpec, check_targets, sweep_file
from orchestrator.sweep.search import CellStudiesSearcher, finished_trials
from orchestrator.sweep.status import stale_trials
from orchestrator.sweep.store import SweepPaths, bind_store, sweep_lock, sweep_paths
from orchestrator.sweep.tune import check_cluster, search_cells
from orchestrator.sweep.winners import evaluate_winners, log_cell_statistics
from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.kinds import kind_of, requirements

log = get_logger("sweep")


def run_sweep(sweep: SweepSpec, tracker: Tracker, storage_root: Path, ray_address: str | None = None,
              verbose: bool = False, max_concurrent: int | None = None,
              on_finished: Callable[[SweepSpec, Tracker], None] | None = None) -> dict:
    """Run (or finish) the sweep; returns the dry-run report of the end state. Ctrl-C ends it
    within seconds: running trials stop and resume from their last checkpoint next time,
    nothing unfinished is marked finished, and :class:`Interrupted` says what is kept.
    ``on_finished`` runs once every cell is tested, with Ray's output still going to the log
    (the command logs the sweep's report there: the sweep does not import the report)."""
    # Ray forwards its workers' lines to this process asynchronously, so a line can arrive
    # after the call that caused it (the exit traceback of a reused Tune process came after
    # tuner.fit had returned, onto the terminal): Ray's output goes to the log file for the
    # whole sweep, and this process's Ray session ends inside, flushing what is left there.
    paths = sweep_paths(sweep, storage_root)
    with sweep_lock(paths), interruptible() as interruption, _noise_to(None if verbose else paths.log_file):
        try:
            finished = _run_sweep(sweep, tracker, paths, ray_address, verbose, interruption, max_concurrent)
            if on_finished is not None:
                on_finished(sweep, tracker)
            return finished
        finally:
            if ray.is_initialized():
                ray.shutdown()


def _run_sweep(sweep: SweepSpec, tracker: Tracker, paths: SweepPaths, ray_address: str | None, verbose: bool,
               interruption, max_concurrent: int | None = None) -> dict:
    cells = [c for c in sweep.cells if c.spec is not None]
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
    concurrency = check_cluster(sweep, cells, ray_address, max_concurrent)
    log.info("preparing data for %d cells", len(cells))
    for selector in requirements([c.spec for c in cells]):
        kind_of(selector).prepare(selector)  # its data is known good before anything is written
    prepared: dict = {}
    supervised = [c for c in cells if c.requirements]  # prepared once their required trials are kept
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


def _search_and_test(sweep, tracker, experiment_id, cells, paths, ray_address, verbose, interruption, supervised,
                     prepared, concurrency: tuple[int, str] | None = None) -> dict:
    """Everything after the first MLflow write: selectors, cell runs, the search, the winners' tests."""
    cell_runs = _cell_runs(tracker, experiment_id, sweep, cells)
    # the selectors (and EAR trials) train concurrently; their cells wait for them in the search
    gates = _start_requirements(sweep, supervised, tracker, experiment_id, paths, ray_address, prepared, cell_runs,
                                interruption)
    migrated = migrate_trial_axes(tracker, experiment_id, cell_runs)
    if migrated:
        log.info("%d trial run(s) of an earlier store now carry their cell's axis tags", migrated)
    _log_data_stats(tracker, cell_runs, [c for c in cells if c not in supervised], prepared)

    searcher = search_cells(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, interruption, gates,
                            concurrency)
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
        evaluate_winners(sweep, tracker, experiment_id, tested, cell_runs, paths, ray_address, first_stage_validation)
    except KeyboardInterrupt:
        raise Interrupted(mark_interrupted(tracker, experiment_id, sweep, searcher, cell_runs)) from None
    root = tracker.sweep_run(experiment_id, sweep.name)
    tracker.finish(root)  # every cell is FINISHED or FAILED now
    log_cell_statistics(sweep, tracker, experiment_id)  # seeds' spread and intervals on the cell runs, for the UI
    return dry_run_report(sweep, paths)


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


def _prepare_cells(sweep: SweepSpec, cells: list[Cell], prepared: dict) -> None:
    """The cells' data (indexes, runs, training sets, augmentations), prepared once before the
    trials race for it (the units ``orchestrate prepare`` builds); ``prepared`` keeps each cell's."""
    prepare_units(preparation_units(sweep, cells))
    for cell in (c for c in cells if c.spec is not None):
        variant = data_variants(cell, sweep)[-1]
        prepared[cell.key] = kind_of(variant).prepare(variant)  # cached: read back, nothing computed


def _start_requirements(sweep: SweepSpec, supervised: list[Cell], tracker: Tracker, experiment_id: str, paths: SweepPaths,
                        ray_address: str | None, prepared: dict, cell_runs: dict[str, str], interruption) -> dict:
    """Each distinct required trial (a supervised selector, an EAR trial) trained once, tracked
    under the sweep run, all at once: each in a driver thread of its own, whose Ray Train
    workers ask for that trial's own resources (MLflow is still written by this process only).
    Once a cell's requirements are kept, its data is prepared (augmentations with the trained
    selector) and its trials may start; cells that need none do not wait for any. Returns cell
    key -> the Future the cell's trials wait for (its exception: why the cell cannot run)."""
    required = requirements([c.spec for c in supervised])
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
        key = trial_key(each)
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
        groups.setdefault(tuple(cell.requirements), []).append(cell)
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
    pending = set(gates.values())
    while pending and not interruption.is_set():
        _, pending = wait(pending, timeout=1)


def _log_data_stats(tracker: Tracker, cell_runs: dict[str, str], cells: list[Cell], prepared: dict) -> None:
    for cell in cells:  # the cell's data, logged once
        listed = tracker.run_artifacts(tracker.client.get_run(cell_runs[cell.key])).list_artifacts()
        if not any(a.path == "data_stats.json" for a in listed):
            tracker.log_json(cell_runs[cell.key], "", "data_stats.json", prepared[cell.key].data_stats)
