"""``orchestrate sweep``: the grid x Optuna x Ray Tune x MLflow, resumable.

- Cells come from :func:`orchestrator.sweep_spec.expand_grid`; each has its own Optuna study
  (:mod:`orchestrator.search`) in ``<storage>/<sweep>/optuna.db``.
- One Tune run per invocation holds every remaining trial of every cell (one scheduling
  pool). Each Tune trial runs the foundation trial as Ray Train workers, named by a stable
  Train run name, so a retried or resumed trial continues from its last epoch checkpoint.
- MLflow (written by the driver only): one experiment per sweep, a parent run per cell and
  a child run per trial, found again by tags (``rerank_lab.trial_key``) on every rerun.
- After the search, each cell's winner re-ranks the test and zero-shot collections; the
  results are logged on the cell run, which is then FINISHED (and never evaluated again).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.search import TRAIN_RUN, CellStudiesSearcher, apply_params, finished_trials, requeue_interrupted
from orchestrator.sweep_spec import TEST_PREFIX, Cell, SweepSpec, expand_grid
from orchestrator.tracking import KIND_TAG, TRIAL_KEY_TAG, Tracker
from workloads.spec import TrialSpec
from workloads.training import WEIGHT_METRIC

CELL_TAG = "rerank_lab.cell"
SWEEP_TAG = "rerank_lab.sweep"
OPTUNA_TAG = "rerank_lab.optuna_trial"
WINNER_TAG = "rerank_lab.winner"
PARENT_TAG = "mlflow.parentRunId"


def _log(message: str) -> None:
    print(f"[sweep] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SweepPaths:
    root: Path

    @property
    def optuna_url(self) -> str:
        return f"sqlite:///{self.root / 'optuna.db'}"

    @property
    def ray_storage(self) -> Path:
        return self.root / "ray"


def sweep_paths(sweep: SweepSpec, storage_root: Path) -> SweepPaths:
    root = Path(storage_root).resolve() / sweep.name
    root.mkdir(parents=True, exist_ok=True)
    return SweepPaths(root)


# ----------------------------------------------------------------------------- plan


@dataclass
class CellProgress:
    cell: Cell
    trials_finished: int
    trials_complete: int
    trials_failed: int
    best: float | None


def progress(sweep: SweepSpec, paths: SweepPaths | None) -> list[CellProgress]:
    """What each cell has done, read from the Optuna storage (nothing is started)."""
    import optuna

    cells = expand_grid(sweep)
    existing: set[str] = set()
    if paths is not None and (paths.root / "optuna.db").exists():
        existing = {s.study_name for s in optuna.get_all_study_summaries(paths.optuna_url)}
    out = []
    for cell in cells:
        if cell.spec is None or cell.key not in existing:
            out.append(CellProgress(cell, 0, 0, 0, None))
            continue
        study = optuna.load_study(study_name=cell.key, storage=paths.optuna_url)
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        failed = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("counted")]
        best = max((t.value for t in complete), default=None)
        out.append(CellProgress(cell, finished_trials(study), len(complete), len(failed), best))
    return out


def dry_run_report(sweep: SweepSpec, paths: SweepPaths | None) -> dict:
    rows = progress(sweep, paths)
    runnable = [r for r in rows if r.cell.spec is not None]
    per_cell = sweep.search.trials_per_cell
    trials_runnable = per_cell * len(runnable)
    trials_done = sum(r.trials_complete + r.trials_failed for r in runnable)
    unavailable: dict[str, int] = {}
    for r in rows:
        if r.cell.unavailable:
            unavailable[r.cell.unavailable] = unavailable.get(r.cell.unavailable, 0) + 1
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
        # the sweep's run + a run per cell (its child) + a run per trial (the cell's child)
        "mlflow_runs_planned": 1 + len(rows) + per_cell * len(rows),
        "mlflow_runs_runnable": 1 + len(runnable) + trials_runnable,
        "cells_detail": [
            {"key": r.cell.key, **r.cell.axes, "searched": list(r.cell.searched), "baseline": r.cell.is_baseline,
             "unavailable": r.cell.unavailable, "trials_done": r.trials_complete + r.trials_failed, "best": r.best}
            for r in rows
        ],
    }


# ----------------------------------------------------------------------------- execution


def _sweep_trial(config: dict) -> None:
    """One Tune trial: the foundation trial as Ray Train workers, reported to Tune per epoch."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from orchestrator.execution import VALIDATION_METRIC, epoch_results, make_trainer
    from workloads.trial import prepare_trial

    spec = TrialSpec.model_validate(config["spec"])
    if config.get("fail_on_purpose"):  # test hook (--fail-cell): count the attempt, then raise
        with open(Path(config["storage"]) / "failed_attempts.log", "a") as log:
            log.write(config["train_run"] + "\n")
        raise RuntimeError("fail_on_purpose: this trial raises (test hook)")
    prepared = prepare_trial(spec)  # cached by content: only a new k_a builds anything
    trainer = make_trainer(spec, prepared.training, Path(config["storage"]), config["train_run"], [TuneReportCallback()])
    try:
        result = trainer.fit()
    except Exception as exc:  # a deterministic out-of-memory is recorded, not retried blindly
        if _is_out_of_memory(exc):
            ray.tune.report({"failure": "oom"})
            return
        raise
    epochs = epoch_results(result)
    best = max(epochs, key=lambda e: e.metrics[VALIDATION_METRIC])
    ray.tune.report({
        VALIDATION_METRIC: best.metrics[VALIDATION_METRIC], "final": 1, "best_epoch": best.metrics["epoch"],
        "best_checkpoint": best.checkpoint,
        **({WEIGHT_METRIC: best.metrics[WEIGHT_METRIC]} if WEIGHT_METRIC in best.metrics else {}),
        "training_seconds": sum(e.metrics["epoch_train_seconds"] + e.metrics.get("epoch_validation_seconds", 0.0) for e in epochs),
    })


def _is_out_of_memory(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in ("OutOfMemoryError", "CUDA out of memory", "MemoryError"))


def _make_callback(tracker: Tracker, experiment_id: str, cell_runs: dict[str, str], sweep: SweepSpec):
    from ray.tune import Callback

    class MlflowTrialLogger(Callback):
        """Logs every Tune trial as a child of its cell's run, from the driver process."""

        def __init__(self):
            self.runs: dict[str, str] = {}
            self.started: dict[str, float] = {}

        def _run_id(self, trial) -> str:
            if trial.trial_id not in self.runs:
                config = trial.config
                spec = TrialSpec.model_validate(config["spec"])
                key = f"{config['cell']}/{config['train_run']}"
                tags = {PARENT_TAG: cell_runs[config["cell"]], CELL_TAG: config["cell"], SWEEP_TAG: sweep.name,
                        OPTUNA_TAG: str(config["optuna_trial"]), **spec.axes()}
                params = {**spec.flat_params(), **{f"searched.{k}": str(v) for k, v in config["params"].items()}}
                self.runs[trial.trial_id] = tracker.start_trial_run(experiment_id, config["train_run"], key, params, tags)
            return self.runs[trial.trial_id]

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started.setdefault(trial.trial_id, time.perf_counter())
            self._run_id(trial)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            run_id = self._run_id(trial)
            if "epoch" in result and "final" not in result:
                metrics = {k: v for k, v in result.items() if k.startswith(("val_", "train_", "epoch_")) and isinstance(v, (int, float))}
                tracker.log_metrics(run_id, metrics, step=int(result["epoch"]))
            if result.get("final"):
                wall = time.perf_counter() - self.started.get(trial.trial_id, time.perf_counter())
                tracker.log_metrics(run_id, {
                    "best_val_ndcg_at_10": result["val_ndcg_at_10"], "best_epoch": result["best_epoch"],
                    "time_trial_wall_seconds": wall, "time_training_seconds": result["training_seconds"],
                    "time_overhead_seconds": wall - result["training_seconds"],
                    **({f"best_{WEIGHT_METRIC}": result[WEIGHT_METRIC]} if WEIGHT_METRIC in result else {}),
                })
                tracker.set_tags(run_id, {"best_checkpoint": result["best_checkpoint"]})
            if result.get("failure"):
                tracker.set_tags(run_id, {"failure": result["failure"]})

        def on_trial_complete(self, iteration, trials, trial, **info):
            run_id = self._run_id(trial)
            failed = trial.last_result.get("failure") if trial.last_result else None
            tracker.finish(run_id, "FAILED" if failed else "FINISHED")

        def on_trial_error(self, iteration, trials, trial, **info):
            run_id = self._run_id(trial)
            error = str(getattr(trial, "error_msg", None) or "error").strip().splitlines()
            tracker.set_tags(run_id, {"failure": "error", "error": (error[-1] if error else "error")[:500]})
            tracker.finish(run_id, "FAILED")

    return MlflowTrialLogger()


def sweep_run(tracker: Tracker, experiment_id: str, sweep_name: str) -> str:
    """The sweep's own MLflow run, parent of its cell runs and home of its reports (found or created).

    ``orchestrate sweep`` marks it RUNNING while it works and FINISHED when every cell is.
    """
    key = f"sweep:{sweep_name}"
    existing = tracker.find_run(experiment_id, key)
    if existing is not None:
        return existing.info.run_id
    run = tracker.client.create_run(experiment_id, run_name=f"sweep {sweep_name}",
                                    tags={TRIAL_KEY_TAG: key, KIND_TAG: "sweep", SWEEP_TAG: sweep_name})
    return run.info.run_id


def _cell_runs(tracker: Tracker, experiment_id: str, sweep: SweepSpec, cells: list[Cell]) -> dict[str, str]:
    """Find or create the parent run of every runnable cell (deterministic identity: the cell key)."""
    root = sweep_run(tracker, experiment_id, sweep.name)
    tracker.client.update_run(root, status="RUNNING")
    runs = {}
    for cell in cells:
        existing = tracker.find_run(experiment_id, cell.key)
        if existing is not None:
            runs[cell.key] = existing.info.run_id
            if existing.data.tags.get(PARENT_TAG) != root:  # a store written before sweep runs existed
                tracker.set_tags(existing.info.run_id, {PARENT_TAG: root})
            continue
        run = tracker.client.create_run(experiment_id, run_name=f"{'/'.join(cell.axes.values())}", tags={
            TRIAL_KEY_TAG: cell.key, KIND_TAG: "cell", CELL_TAG: cell.key, SWEEP_TAG: sweep.name, PARENT_TAG: root,
            "baseline": str(cell.is_baseline).lower(), **cell.axes})
        tracker.log_json(run.info.run_id, "", "cell.json", {"axes": cell.axes, "searched": list(cell.searched),
                                                             "spec": cell.spec.model_dump(mode="json", by_alias=True)})
        runs[cell.key] = run.info.run_id
    return runs


def _max_concurrent(sweep: SweepSpec, cells: list[Cell]) -> int:
    import ray

    if sweep.search.max_concurrent_trials:
        return sweep.search.max_concurrent_trials
    resources = ray.cluster_resources()
    spec = cells[0].spec
    per_trial = spec.resources.workers * spec.resources.cpus_per_worker
    return max(1, int(resources.get("CPU", 1) // per_trial))


def evaluation_targets(sweep: SweepSpec, spec: TrialSpec) -> list[tuple[str, TrialSpec]]:
    """(metric prefix, trial spec whose test data is that target) for every collection a
    winner is tested on: the cell's own test data first, exactly as configured (its
    ``data.test_collection`` and ``test_split``), then each zero-shot collection."""
    targets = [(TEST_PREFIX, spec)]
    for zero_shot in sweep.zero_shot:
        data = spec.data.model_copy(update={"test_collection": zero_shot.collection, "test_split": zero_shot.split})
        targets.append((zero_shot.metric_prefix, spec.model_copy(update={"data": data})))
    return targets


def _data_variants(cell: Cell, sweep: SweepSpec) -> list[TrialSpec]:
    """The cell's spec once per searched k_a: each k_a is an augmentation set of its own,
    which the trials would otherwise build themselves, concurrently and more than once."""
    if "k" in cell.searched and sweep.search.k is not None:
        return [apply_params(cell.spec, {"k": k}) for k in sweep.search.k.choices]
    return [cell.spec]


def run_sweep(sweep: SweepSpec, tracker: Tracker, storage_root: Path, ray_address: str | None = None,
              fail_cells: set[str] | None = None) -> dict:
    """Run (or finish) the sweep; returns the dry-run report of the end state."""
    import ray.tune

    from orchestrator.execution import init_ray
    from workloads.trial import prepare_trial

    paths = sweep_paths(sweep, storage_root)
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    if not cells:
        raise ValueError(f"sweep {sweep.name}: no cell has a workload yet")
    experiment_id = tracker.experiment_id(sweep.name)
    cell_runs = _cell_runs(tracker, experiment_id, sweep, cells)

    _log(f"preparing data for {len(cells)} cells")
    for cell in cells:
        for spec in _data_variants(cell, sweep):
            prepare_trial(spec)  # indexes, runs, training sets, augmentations: once, in the driver, before trials race
        for _, target in evaluation_targets(sweep, cell.spec)[1:]:
            prepare_trial(target)  # a zero-shot collection that cannot load fails now, not after every trial trained

    searcher = CellStudiesSearcher(cells, sweep.search, paths.optuna_url)
    requeued = sum(requeue_interrupted(s) for s in searcher.studies.values())
    if requeued:
        _log(f"{requeued} trial(s) interrupted by a previous driver will resume from their checkpoints")
    remaining = searcher.remaining()
    if remaining:
        init_ray(ray_address)
        concurrent = _max_concurrent(sweep, cells)
        _log(f"{remaining} trial(s) to run, up to {concurrent} at a time")
        searcher.extra_config = {"storage": str(paths.ray_storage)}
        searcher.failing_cells = set(fail_cells or ())
        tuner = ray.tune.Tuner(
            # The Train workers hold the trial's CPUs and GPUs. The Tune trial itself reserves a
            # little memory, not a CPU fraction: 0.01 CPU per trial leaves no node a whole CPU
            # for a 1-CPU worker (a deadlock on 1-CPU nodes, one trial at a time on 2 CPUs).
            ray.tune.with_resources(_sweep_trial, {"cpu": 0, "memory": 64 * 1024**2}),
            tune_config=ray.tune.TuneConfig(search_alg=searcher, num_samples=remaining,
                                            max_concurrent_trials=concurrent),
            run_config=ray.tune.RunConfig(
                name=f"tune-{int(time.time())}", storage_path=str(paths.ray_storage),
                failure_config=ray.tune.FailureConfig(max_failures=sweep.max_failures),
                callbacks=[_make_callback(tracker, experiment_id, cell_runs, sweep)], verbose=0,
            ),
        )
        with contextlib.redirect_stdout(sys.stderr):  # Tune's tables must not mix with --json on stdout
            tuner.fit()

    _evaluate_winners(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address)
    tracker.finish(sweep_run(tracker, experiment_id, sweep.name))  # every cell is FINISHED or FAILED now
    return dry_run_report(sweep, paths)


def _evaluate_winners(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address) -> None:
    """Test every cell's winner (and zero-shot), all evaluations in flight at once."""
    import optuna
    import ray

    from orchestrator.execution import init_ray, submit_evaluation
    from workloads.trial import final_interpolation, prepare_trial

    pending = []  # (cell, run id, winner, child run, [(prefix, prepared, ObjectRef)])
    for cell in cells:
        run_id = cell_runs[cell.key]
        if tracker.client.get_run(run_id).info.status == "FINISHED":
            continue  # evaluated by an earlier invocation
        study = optuna.load_study(study_name=cell.key, storage=paths.optuna_url)
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        if not complete:
            tracker.set_tags(run_id, {"failure": "all trials failed"})
            tracker.finish(run_id, "FAILED")
            continue
        winner = max(complete, key=lambda t: t.value)
        child = tracker.find_run(experiment_id, f"{cell.key}/{winner.user_attrs[TRAIN_RUN]}")
        checkpoint = child.data.tags["best_checkpoint"]
        spec = apply_params(cell.spec, winner.params)
        init_ray(ray_address)
        jobs = []
        for prefix, target in evaluation_targets(sweep, spec):
            prepared = prepare_trial(target)
            interpolation = final_interpolation(spec, child.data.metrics.get(f"best_{WEIGHT_METRIC}"))
            jobs.append((prefix, prepared, submit_evaluation(target, prepared, checkpoint, interpolation)))
        pending.append((cell, run_id, winner, complete, child, jobs))
    if pending:
        _log(f"testing the winners of {len(pending)} cells ({sum(len(p[-1]) for p in pending)} evaluations)")
    for cell, run_id, winner, complete, child, jobs in pending:
        try:
            for prefix, prepared, ref in jobs:
                tested = ray.get(ref)
                tracker.log_evaluation(run_id, prefix, tested.evaluation)
                if tested.weight is not None:
                    tracker.log_metrics(run_id, {f"{prefix}interpolation_weight": tested.weight})
                tracker.log_metrics(run_id, {f"bm25_{prefix}{k}": v for k, v in prepared.first_stage_test.aggregate.items()})
        except BaseException as exc:  # never left RUNNING: a rerun evaluates a FAILED cell again
            tracker.set_tags(run_id, {"failure": "evaluation", "error": str(exc).strip().splitlines()[-1][:500] if str(exc).strip() else type(exc).__name__})
            tracker.finish(run_id, "FAILED")
            raise
        tracker.log_metrics(run_id, {"best_val_ndcg_at_10": winner.value, "trials_complete": len(complete)})
        tracker.set_tags(run_id, {WINNER_TAG: child.info.run_id, "winner_params": str(winner.params)})
        tracker.set_tags(child.info.run_id, {WINNER_TAG: "true"})
        tracker.finish(run_id, "FINISHED")
        _log(f"{cell.key} ({'/'.join(cell.axes.values())}): winner trial {winner.number} val nDCG@10 {winner.value:.4f}, "
             f"test nDCG@10 {tracker.run_metrics(run_id)['test_ndcg_at_10']:.4f}")


def sweep_status(sweep: SweepSpec, tracker: Tracker, storage_root: Path) -> dict:
    """Progress from MLflow (runs) and Optuna (trials left): nothing is started."""
    plan = dry_run_report(sweep, sweep_paths(sweep, storage_root))
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    runs = tracker.client.search_runs([experiment.experiment_id], max_results=50_000) if experiment else []
    cells = [r for r in runs if r.data.tags.get(KIND_TAG) == "cell"]
    trials = [r for r in runs if r.data.tags.get(KIND_TAG) == "trial"]
    by_status = lambda rs, s: [r for r in rs if r.info.status == s]  # noqa: E731
    running_cells = {r.data.tags.get(CELL_TAG) for r in by_status(trials, "RUNNING")}
    scored = [r for r in trials if "best_val_ndcg_at_10" in r.data.metrics]
    best = max(scored, key=lambda r: r.data.metrics["best_val_ndcg_at_10"], default=None)
    walls = [r.data.metrics["time_trial_wall_seconds"] for r in trials if "time_trial_wall_seconds" in r.data.metrics]
    mean_wall = sum(walls) / len(walls) if walls else None
    parallel = max(1, len(by_status(trials, "RUNNING")))
    return {
        "sweep": sweep.name,
        "cells": plan["runnable_cells"],
        "cells_done": len(by_status(cells, "FINISHED")),
        "cells_failed": len(by_status(cells, "FAILED")),
        "cells_running": len(running_cells),
        "cells_pending": plan["runnable_cells"] - len(by_status(cells, "FINISHED")) - len(by_status(cells, "FAILED")) - len(running_cells),
        "trials_finished": len(by_status(trials, "FINISHED")),
        "trials_failed": len(by_status(trials, "FAILED")),
        "trials_running": len(by_status(trials, "RUNNING")),
        "trials_to_run": plan["trials_to_run"],
        "best": {"cell": best.data.tags.get(CELL_TAG), "axes": "/".join(best.data.tags.get(k, "") for k in ("model", "loss", "augmentation", "size")),
                 "value": best.data.metrics["best_val_ndcg_at_10"]} if best else None,
        "mean_trial_seconds": mean_wall,
        "eta_seconds": mean_wall * plan["trials_to_run"] / parallel if mean_wall is not None else None,
        "failed_trials": [f"{r.info.run_name} ({r.data.tags.get(CELL_TAG)}): {r.data.tags.get('failure', '?')} "
                          f"{r.data.tags.get('error', '')}".strip() for r in by_status(trials, "FAILED")],
    }
