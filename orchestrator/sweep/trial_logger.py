"""The sweep's Tune callback: every Tune trial logged as a child run of its cell, from the driver."""

from __future__ import annotations

import time
from pathlib import Path

from ray.tune import Callback

from orchestrator.core import schema
from orchestrator.core.lifecycle import SUMMARY_METRICS, training_data_identity
from orchestrator.core.tracking import Tracker, mark_pruned
from orchestrator.sweep.grid import SweepSpec
from orchestrator.sweep.progress import SweepProgress
from orchestrator.sweep.retention import keep_chosen_and_last
from workloads.kinds import TRIAL_KINDS


class MlflowTrialLogger(Callback):
    """Logs every Tune trial as a child of its cell's run, from the driver process."""

    def __init__(self, tracker: Tracker, experiment_id: str, cell_runs: dict[str, str], sweep: SweepSpec,
                 display: SweepProgress, searcher, interruption=None):
        self.tracker, self.experiment_id, self.cell_runs, self.sweep = tracker, experiment_id, cell_runs, sweep
        self.display, self.searcher, self.interruption = display, searcher, interruption
        self.runs: dict[str, str] = {}
        self.started: dict[str, float] = {}

    def _run_id(self, trial) -> str:
        if trial.trial_id not in self.runs:
            config = trial.config
            spec = TRIAL_KINDS[config.get("kind", "rerank")].spec.model_validate(config["spec"])
            key = f"{config['cell']}/{config['train_run']}"
            # a cell and its trials carry the same axis tags (the cell's: a searched SIR schedule
            # is a param, not a new loss label)
            tags = {schema.PARENT_TAG: self.cell_runs[config["cell"]], schema.CELL_TAG: config["cell"],
                    schema.SWEEP_TAG: self.sweep.name, schema.OPTUNA_TAG: str(config["optuna_trial"]),
                    schema.DATA_TAG: training_data_identity(spec),
                    **schema.axes(spec), **config.get("axes", {}), **config.get("tags", {})}
            params = {**schema.flat_params(spec), **{f"searched.{k}": str(v) for k, v in config["params"].items()},
                      **schema.comparison_params(config.get("axes", {}), config["params"])}
            self.runs[trial.trial_id] = self.tracker.start_trial_run(self.experiment_id, config["train_run"], key, params, tags)
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started.setdefault(trial.trial_id, time.perf_counter())
        self._run_id(trial)
        self.display.trial_started(trial.config["cell"])

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._run_id(trial)
        if "epoch" in result and "final" not in result:
            metrics = {k: v for k, v in result.items() if schema.is_epoch_metric(k) and isinstance(v, (int, float))}
            self.tracker.log_metrics(run_id, metrics, step=int(result["epoch"]))
            self.display.epoch_done()
        if result.get("final"):
            wall = time.perf_counter() - self.started.get(trial.trial_id, time.perf_counter())
            summary = {k: v for k, v in result.items() if (k in SUMMARY_METRICS or k.startswith(schema.BEST_PREFIX))
                       and isinstance(v, (int, float)) and not isinstance(v, bool)}
            self.tracker.log_metrics(run_id, {**summary, schema.TIME_TRIAL: wall})
            self.tracker.set_tags(run_id, {schema.CHECKPOINT_TAG: result[schema.CHECKPOINT_TAG]})
            self.display.trial_seconds(wall)
        if result.get("failure"):
            self.tracker.set_tags(run_id, {schema.FAILURE_TAG: result["failure"]})

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._run_id(trial)
        if trial.trial_id in self.searcher.pruned:  # stopped by the cell's pruner: recorded, not a result
            mark_pruned(self.tracker, run_id, self.searcher.pruned[trial.trial_id],
                        time.perf_counter() - self.started.get(trial.trial_id, time.perf_counter()))
            self.display.trial_ended(trial.config["cell"], failed=False)
            return
        failed = trial.last_result.get("failure") if trial.last_result else None
        self.tracker.finish(run_id, "FAILED" if failed else "FINISHED")
        if not failed and self.sweep.storage.keep == "winners" and schema.CHECKPOINT_TAG in (trial.last_result or {}):
            # Tune told the searcher first: the Optuna trial is COMPLETE, never run again
            keep_chosen_and_last(Path(trial.config["storage"]) / trial.config["train_run"],
                                 trial.last_result[schema.CHECKPOINT_TAG])
        self.display.trial_ended(trial.config["cell"], failed=bool(failed))

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._run_id(trial)
        if self.interruption is not None and self.interruption.is_set():  # stopped by Ctrl-C: resumed next time
            self.tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})
            self.tracker.finish(run_id, "KILLED")
            return
        self.tracker.fail(run_id, "error", str(getattr(trial, "error_msg", None) or "error"))
        self.display.trial_ended(trial.config["cell"], failed=True)
