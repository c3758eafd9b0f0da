"""The Tune search of a sweep: one Tune run holds every remaining trial of every cell (one
scheduling pool), served by the cells' Optuna studies (:mod:`orchestrator.sweep.search`).

- :func:`_sweep_trial`, one Tune trial: its :class:`~orchestrator.sweep.search.TrialConfig`,
  walked through the one lifecycle (:class:`TuneTrialSteps`): Ray Train workers named by a
  stable Train run name, so a retried or resumed trial continues from its last epoch
  checkpoint; the epoch chosen by the one rule and reported. A deterministic out-of-memory is
  a result (``failure=oom``), a worker the memory monitor killed is retried.
- :func:`search_cells`: the cells' studies as one searcher, what a killed driver left open
  (:func:`reconcile_trial_runs`, requeued trials), then the Tune run (:func:`run_search`).
- How many trials run at once (:func:`check_cluster`), the stopper that ends the run on
  Ctrl-C, and the Tune callback :class:`MlflowTrialLogger`: every Tune trial logged as a child
  run of its cell, from the driver.
- :class:`SweepProgress`: the live progress display (cells and trials done / running / failed,
  elapsed, ETA).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

import optuna
import ray.tune
from ray.exceptions import OutOfMemoryError
from ray.tune import Callback, Stopper

from orchestrator.core import schema
from orchestrator.core.execution import (
    check_resources,
    cluster_has_gpu,
    epoch_results,
    init_ray,
    input_error_in,
    limits_unreadable,
    make_trainer,
    trial_capacity,
)
from orchestrator.core.tracking import Tracker, mark_pruned
from orchestrator.lifecycle.identity import training_data_identity
from orchestrator.lifecycle.run import SUMMARY_METRICS, timing, training_summary
from orchestrator.sweep.grid import Cell, SweepSpec, sweep_file
from orchestrator.sweep.search import (
    COUNTED,
    FAILURE,
    INPUT_ERROR_PROBLEM,
    INPUT_ERROR_SOURCE,
    INPUT_FAILURE,
    TRAIN_RUN,
    CellStudiesSearcher,
    TrialConfig,
    finished_trials,
    requeue_interrupted,
    stop_file,
)
from orchestrator.sweep.winners import keep_chosen_and_last
from workloads.core.errors import InputError
from workloads.core.logs import clock, get_logger
from workloads.core.logs import configure as configure_logging
from workloads.kinds import TrialKind, kind_of, run_steps

log = get_logger("sweep")


# Test hook (never set in production): a comma-separated list of cell keys whose trials raise
# on purpose, each attempt appended to <storage>/failed_attempts.log. Read here only.
FAIL_CELLS_ENV = "ORCHESTRATE_TEST_FAIL_CELLS"

# In a trial's final (or pruned) result: every epoch's metrics (JSON), so that the driver logs the epochs it
# never received: a trial resumed after a driver's kill continues after its last checkpoint and
# does not report the epochs before it again, which the killed driver may not have logged.
EPOCH_HISTORY = "epoch_history"


class _Ended(Exception):
    """The trial ended with an outcome Tune has been told (out of memory, pruned): no epoch to choose."""


class TuneTrialSteps:
    """A sweep's Tune trial through the one lifecycle (:func:`workloads.kinds.run_steps`): its
    required trials were finished by the driver before its cell was served; its data was prepared
    by the driver (cached by content: here it is read); it trains as Ray Train workers reporting
    each epoch to Tune, under a stable Train run name, so a retried or resumed trial continues from
    its last epoch checkpoint; the epoch is chosen by the one rule, and the chosen epoch and the
    training summary are reported to Tune. Its cell's winner is tested, kept and logged by the
    driver (:mod:`~orchestrator.sweep.winners`), so a trial tests and keeps nothing."""

    def __init__(self, config: TrialConfig) -> None:
        self.config = config

    def reused(self, kind: TrialKind, spec) -> None:
        return None  # the cell's study served it: it runs (a resumed one continues from its checkpoint)

    def require(self, kind: TrialKind, spec, required: list) -> None:
        return None  # the driver finished them before it served the cell

    def prepare(self, kind: TrialKind, spec):
        if self.config.cell in os.environ.get(FAIL_CELLS_ENV, "").split(","):  # test hook, see FAIL_CELLS_ENV
            with open(Path(self.config.storage) / "failed_attempts.log", "a") as attempts:
                attempts.write(self.config.train_run + "\n")
            raise RuntimeError(f"{FAIL_CELLS_ENV}: this trial raises on purpose")
        return kind.prepare(spec)  # cached by content: the driver prepared every k_a (every n of EAR)

    def train(self, kind: TrialKind, spec, prepared) -> list:
        from ray.tune.integration.ray_train import TuneReportCallback  # (Ray Train: loaded where a trial runs)

        pruned = stop_file(self.config.storage, self.config.train_run)
        trainer = make_trainer(spec, kind.worker_inputs(prepared), Path(self.config.storage), self.config.train_run,
                               [TuneReportCallback()], stop_file=pruned)
        self.started = time.perf_counter()
        try:
            result = trainer.fit()
        except Exception as exc:  # a deterministic out-of-memory is recorded, not retried blindly
            if _is_out_of_memory(exc):
                ray.tune.report({"failure": "oom", schema.OBJECTIVE: float("nan")})  # Tune insists on the metric
                raise _Ended from None
            raise
        epochs = epoch_results(result)
        if pruned.exists():  # stopped by its cell's pruner: an outcome, not a result (Tune insists on the metric)
            ray.tune.report({schema.PRUNED_TAG: max((int(e.metrics["epoch"]) for e in epochs), default=0),
                             schema.OBJECTIVE: max((e.metrics[schema.OBJECTIVE] for e in epochs), default=float("nan")),
                             EPOCH_HISTORY: json.dumps([epoch_metrics(e.metrics) for e in epochs])})
            raise _Ended
        return epochs

    def test(self, kind: TrialKind, spec, prepared, chosen) -> list:
        return []  # (the cell's winner is tested by the driver)

    def keep(self, kind: TrialKind, spec, chosen, tested: list) -> None:
        return None  # (the retention of checkpoints is the driver's, once Tune has the result)

    def log(self, kind: TrialKind, spec, epochs: list, chosen, tested: list, kept) -> None:
        summary = training_summary([e.metrics for e in epochs])  # as every trial of every kind
        ray.tune.report({**summary, **timing(time.perf_counter() - self.started, summary),
                         schema.OBJECTIVE: chosen.metrics[schema.OBJECTIVE], "final": 1, schema.CHECKPOINT_TAG: chosen.checkpoint,
                         EPOCH_HISTORY: json.dumps([epoch_metrics(e.metrics) for e in epochs])})

    def stopped(self, error: BaseException) -> None:
        return None  # Tune records the error (or the outcome reported before an _Ended)


def _sweep_trial(config: dict) -> None:
    """One Tune trial: the cell's trial through :class:`TuneTrialSteps`."""
    configure_logging()  # the driver's level, from the environment
    trial = TrialConfig.of(config)
    try:
        run_steps(trial.trial_spec(), TuneTrialSteps(trial))
    except _Ended:
        return
    except Exception as exc:  # bad input fails every attempt alike: an outcome, not retried, that stops the sweep
        error = input_error_in(exc)  # (its Train workers' too: under Train's ControllerError)
        if error is None:
            raise
        ray.tune.report({FAILURE: INPUT_FAILURE, INPUT_ERROR_SOURCE: error.source, INPUT_ERROR_PROBLEM: error.problem,
                         schema.OBJECTIVE: float("nan")})  # Tune insists on the metric


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


def reconcile_trial_runs(tracker: Tracker, experiment_id: str, searcher: CellStudiesSearcher) -> int:
    """Close trial runs a killed driver left open after their Optuna trial had ended (Tune tells
    the searcher before the callbacks): COMPLETE -> FINISHED, a counted FAIL -> FAILED.
    Returns how many were closed."""
    # one query for every open trial run, not one per Optuna trial (a grid has thousands)
    open_runs = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in tracker.runs_of_kind(experiment_id, schema.TRIAL)
                 if r.info.status == "RUNNING"}
    closed = 0
    for cell_key, study in searcher.studies.items():
        for trial in study.get_trials(deepcopy=False):
            if trial.state == optuna.trial.TrialState.PRUNED:
                run = open_runs.get(f"{cell_key}/{trial.user_attrs.get(TRAIN_RUN)}")
                if run is not None:
                    mark_pruned(tracker, run.info.run_id, trial.user_attrs.get(schema.PRUNED_TAG, 0))
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


def check_cluster(sweep: SweepSpec, cells: list[Cell], ray_address: str | None,
                   max_concurrent: int | None = None) -> tuple[int, str]:
    """Every cell's workers fit on some node (of the live cluster, or of the autoscaler's node
    types), checked before any data is prepared or any run is written; returns the trials in
    flight at once and why (:func:`_max_concurrent`, which refuses now where it cannot know)."""
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


def _max_concurrent(sweep: SweepSpec, cells: list[Cell], max_concurrent: int | None = None) -> tuple[int, str]:
    """Trials in flight at once, and why: ``--max-concurrent`` (``max_concurrent``), else
    ``search.max_concurrent_trials``, else what the cluster holds at its largest
    (:func:`~orchestrator.core.execution.trial_capacity`, the autoscaler's limits where there is
    one), for the most demanding cell's trial shape. Where the autoscaler's limits cannot be
    read, the live nodes are no answer (GPU workers scaling from 0 are not live yet, and a sweep
    capped at the nodes that are up never asks for more): one line asking for either setting."""
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


class _InterruptStopper(Stopper):
    """Ends the Tune run once the command is interrupted (Tune stops its trials and returns)."""

    def __init__(self, interruption, trial_logger: MlflowTrialLogger | None = None):
        self.interruption, self.trial_logger = interruption, trial_logger

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):  # and once a trial found bad input: every other trial would meet it too
        return self.interruption.is_set() or (self.trial_logger is not None and self.trial_logger.input_error is not None)


def search_cells(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, interruption, gates: dict,
                 concurrency: tuple[int, str] | None = None) -> CellStudiesSearcher:
    """The search of every cell: the cells' Optuna studies as one searcher (a cell's trials wait
    for its ``gates``: its required trials), what a killed driver left (closed, requeued), then the
    Tune run of every remaining trial. Returns the searcher (its studies hold the outcome)."""
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
        run_search(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, searcher, display,
                   interruption, remaining, concurrency)
    return searcher


def run_search(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address, verbose, searcher, display, interruption,
            remaining, concurrency: tuple[int, str] | None = None) -> None:
    """The Tune run of every remaining trial (one scheduling pool); returns early when interrupted."""
    init_ray(ray_address)
    concurrent, why = concurrency or _max_concurrent(sweep, cells)
    log.info("%d trial(s) to run, up to %d at a time (%s)%s", remaining, concurrent, why.split(";")[0],
             "" if verbose else f"; Ray's own output goes to {paths.log_file}")
    display.concurrency = concurrent
    searcher.storage = str(paths.ray_storage)
    trial_logger = MlflowTrialLogger(tracker, experiment_id, cell_runs, sweep, display, searcher, interruption)
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
            # Tune's CSV and JSON result files, and not its TensorBoard files (TUNE_DISABLE_AUTO_CALLBACK_LOGGERS
            # below): runs are tracked in MLflow, and tensorboardX's exit hook starts a thread at interpreter
            # shutdown, which Python 3.12+ refuses: an interrupted sweep's last line was that RuntimeError
            callbacks=[trial_logger, ray.tune.logger.CSVLoggerCallback(), ray.tune.logger.JsonLoggerCallback()],
            stop=_InterruptStopper(interruption, trial_logger),
            verbose=0,
        ),
    )
    # Tune's own SIGINT handler would take the first Ctrl-C from ours; ours ends the run the
    # same way (its stopper), and knows the command was interrupted.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"  # (the loggers above, without TensorBoard's)
    with interruption.graceful(lambda: None):  # the stopper ends the Tune run at its next step
        tuner.fit()
    display.close()
    if trial_logger.input_error is not None:
        trial_logger.close_stopped()
        raise trial_logger.input_error


# ----------------------------------------------------------------------------- the Tune callback

EPOCH_CLOCK = "epoch_train_seconds"  # logged with every epoch (training_summary needs it): which epochs a run holds


def epoch_metrics(result: dict) -> dict[str, float]:
    """What a trial run logs of an epoch (step = epoch): the loop's own numbers, not Tune's."""
    return {k: v for k, v in result.items() if schema.is_epoch_metric(k) and isinstance(v, (int, float)) and not isinstance(v, bool)}


class MlflowTrialLogger(Callback):
    """Logs every Tune trial as a child of its cell's run, from the driver process."""

    def __init__(self, tracker: Tracker, experiment_id: str, cell_runs: dict[str, str], sweep: SweepSpec,
                 display: SweepProgress, searcher, interruption=None):
        self.tracker, self.experiment_id, self.cell_runs, self.sweep = tracker, experiment_id, cell_runs, sweep
        self.display, self.searcher, self.interruption = display, searcher, interruption
        self.runs: dict[str, str] = {}
        self.started: dict[str, float] = {}
        self.logged_epochs: dict[str, set[int]] = {}  # tune trial id -> the epochs this driver logged
        self.input_error: InputError | None = None  # the first a trial reported: the sweep stops on it

    def _run_id(self, trial) -> str:
        if trial.trial_id not in self.runs:
            config = TrialConfig.of(trial.config)
            spec = config.trial_spec()
            key = f"{config.cell}/{config.train_run}"
            # a cell and its trials carry the same axis tags (the cell's: a searched SIR schedule
            # is a param, not a new loss label)
            tags = {schema.PARENT_TAG: self.cell_runs[config.cell], schema.CELL_TAG: config.cell,
                    schema.SWEEP_TAG: self.sweep.name, schema.OPTUNA_TAG: str(config.optuna_trial),
                    schema.DATA_TAG: training_data_identity(spec), **kind_of(spec).axes(spec), **config.axes, **config.tags}
            params = {**schema.flat_params(spec), **{f"searched.{k}": str(v) for k, v in config.params.items()},
                      **schema.comparison_params(config.axes, config.params)}
            self.runs[trial.trial_id] = self.tracker.start_trial_run(self.experiment_id, config.train_run, key, params, tags)
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started.setdefault(trial.trial_id, time.perf_counter())
        self._run_id(trial)
        self.display.trial_started(trial.trial_id)

    def on_trial_recover(self, iteration, trials, trial, **info):
        # a failure Tune retries (max_failures): the trial waits to start again, neither running nor ended
        self.display.trial_retrying(trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._run_id(trial)
        if "epoch" in result and "final" not in result:
            self.tracker.log_metrics(run_id, epoch_metrics(result), step=int(result["epoch"]))
            self.logged_epochs.setdefault(trial.trial_id, set()).add(int(result["epoch"]))
            self.display.epoch_done()
        if EPOCH_HISTORY in result:  # (a final or a pruned trial's result)
            self._log_unlogged_epochs(trial.trial_id, run_id, json.loads(result[EPOCH_HISTORY]))
        if result.get("final"):
            wall = time.perf_counter() - self.started.get(trial.trial_id, time.perf_counter())
            summary = {k: v for k, v in result.items() if (k in SUMMARY_METRICS or k.startswith(schema.BEST_PREFIX))
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.tracker.log_metrics(run_id, {**summary, schema.TIME_TRIAL: wall})
            self.tracker.set_tags(run_id, {schema.CHECKPOINT_TAG: result[schema.CHECKPOINT_TAG]})
            self.display.trial_seconds(wall)
        if result.get("failure"):
            self.tracker.set_tags(run_id, {schema.FAILURE_TAG: result["failure"]})
        if result.get("failure") == INPUT_FAILURE:
            error = InputError(result[INPUT_ERROR_SOURCE], result[INPUT_ERROR_PROBLEM])
            self.input_error = self.input_error or error
            self.tracker.fail(run_id, INPUT_FAILURE, error)  # now: the stopper ends the run before its trial completes

    def _log_unlogged_epochs(self, trial_id: str, run_id: str, history: list[dict]) -> None:
        """The epochs of a trial's history that its run does not hold (a resumed trial's, which a
        killed driver received but never logged, or never received): each logged once."""
        missing = [m for m in history if int(m["epoch"]) not in self.logged_epochs.get(trial_id, set())]
        if not missing:
            return  # (every epoch came through this driver: no query)
        held = {m.step for m in self.tracker.client.get_metric_history(run_id, EPOCH_CLOCK)}
        for metrics in missing:
            if int(metrics["epoch"]) not in held:
                self.tracker.log_metrics(run_id, metrics, step=int(metrics["epoch"]))

    def close_stopped(self) -> None:
        """After bad input stopped the sweep: the trials it stopped are KILLED and marked interrupted
        (their Optuna trials stay RUNNING: the next run resumes them, as after Ctrl-C)."""
        for run_id in self.runs.values():
            if self.tracker.client.get_run(run_id).info.status == "RUNNING":
                self.tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})
                self.tracker.finish(run_id, "KILLED")

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._run_id(trial)
        if trial.trial_id in self.searcher.pruned:  # stopped by the cell's pruner: recorded, not a result
            mark_pruned(self.tracker, run_id, self.searcher.pruned[trial.trial_id],
                        time.perf_counter() - self.started.get(trial.trial_id, time.perf_counter()))
            self.display.trial_ended(trial.trial_id, TrialConfig.of(trial.config).cell, failed=False)
            return
        failed = trial.last_result.get("failure") if trial.last_result else None
        self.tracker.finish(run_id, "FAILED" if failed else "FINISHED")
        if not failed and self.sweep.storage.keep == "winners" and schema.CHECKPOINT_TAG in (trial.last_result or {}):
            # Tune told the searcher first: the Optuna trial is COMPLETE, never run again
            config = TrialConfig.of(trial.config)
            keep_chosen_and_last(Path(config.storage) / config.train_run,
                                 trial.last_result[schema.CHECKPOINT_TAG])
        self.display.trial_ended(trial.trial_id, TrialConfig.of(trial.config).cell, failed=bool(failed))

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._run_id(trial)
        if self.interruption is not None and self.interruption.is_set():  # stopped by Ctrl-C: resumed next time
            self.tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})
            self.tracker.finish(run_id, "KILLED")
            return
        self.tracker.fail(run_id, "error", str(getattr(trial, "error_msg", None) or "error"))
        self.display.trial_ended(trial.trial_id, TrialConfig.of(trial.config).cell, failed=True)


# ----------------------------------------------------------------------------- the live progress display
# The sweep's live progress display: cells and trials done / running / failed, elapsed, ETA.
# On a terminal it is one line rewritten in place; otherwise (CI, a file) a line is printed
# whenever a trial ends. It writes to the stream the process had when it started, so it
# stays visible while Ray's own output is sent to the sweep's log file.


class SweepProgress:
    def __init__(self, sweep: str, finished_per_cell: dict[str, int], trials_per_cell: int, enabled: bool = True,
                 stream: TextIO | None = None):
        self.sweep = sweep
        self.trials_per_cell = trials_per_cell
        self.finished = dict(finished_per_cell)  # cell -> trials ended (complete or failed)
        # Tune trial ids: a trial Tune retries after a failure (max_failures) starts again without having ended
        self.running: set[str] = set()
        self.failed = 0
        self.epochs = 0
        self.walls: list[float] = []
        self.concurrency = 1
        self.enabled = enabled
        self._stream = stream  # None: the process's own stderr, looked up when written
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._shown = False

    @property
    def stream(self) -> TextIO:
        # Not kept as an attribute: Tune pickles its callbacks (with this display) when the
        # sweep starts, and cloudpickle pickles only sys.stdout and sys.stderr themselves,
        # which, while Ray's output goes to the log file, sys.__stderr__ is not.
        return self._stream or sys.__stderr__

    # events (from the driver's Tune callback)
    def trial_started(self, trial_id: str) -> None:
        self.running.add(trial_id)
        self._show()

    def trial_retrying(self, trial_id: str) -> None:
        self.running.discard(trial_id)
        self._show()

    def epoch_done(self) -> None:
        self.epochs += 1
        if self.tty:
            self._show()

    def trial_seconds(self, seconds: float) -> None:
        self.walls.append(seconds)

    def trial_ended(self, trial_id: str, cell: str, failed: bool) -> None:
        self.running.discard(trial_id)
        self.finished[cell] = self.finished.get(cell, 0) + 1
        self.failed += int(failed)
        self._show(force_line=True)

    # rendering
    def line(self) -> str:
        total = self.trials_per_cell * len(self.finished)
        done = sum(self.finished.values())
        running = len(self.running)
        cells_done = sum(1 for n in self.finished.values() if n >= self.trials_per_cell)
        elapsed = time.perf_counter() - self.started
        eta = "?"
        if self.walls:
            eta = clock(sum(self.walls) / len(self.walls) * (total - done) / max(1, self.concurrency))
        return (f"[sweep] {self.sweep}: cells {cells_done}/{len(self.finished)} done | trials {done}/{total} done, "
                f"{running} running, {self.failed} failed | elapsed {clock(elapsed)}, ETA {eta}")

    def _show(self, force_line: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
            self._shown = True
        elif force_line:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
