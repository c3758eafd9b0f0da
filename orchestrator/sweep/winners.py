"""A sweep's winners: after the search, each cell's best trial is tested on every target with the
lifecycle's :func:`~orchestrator.lifecycle.targets.submit_evaluations` and
:func:`~orchestrator.lifecycle.targets.log_target` on the cell run, which is then FINISHED; a
winner of a kind that keeps its result (EAR) is kept as the trial of its parameters would be.
"""

from __future__ import annotations

import json

import optuna
import yaml

from orchestrator.core import schema
from orchestrator.core.execution import init_ray
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import test_data_identity
from orchestrator.lifecycle.run import keep_result
from orchestrator.lifecycle.targets import log_target, submit_evaluations, targets
from orchestrator.sweep.retention import keep_winners
from orchestrator.sweep.search import TRAIN_RUN, optuna_storage
from workloads.core.logs import get_logger
from workloads.kinds import kind_of

log = get_logger("sweep")


def evaluate_winners(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address,
                      first_stage_validation: dict[str, dict[str, float]]) -> None:
    """Test every cell's winner (its best trial over all its trials) on every target with the
    lifecycle, all evaluations in flight at once. A cell already tested is tested again when its
    winner is no longer its best trial or its test data changed."""
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
        spec = kind_of(cell.spec).apply_params(cell.spec, winner.params)
        evaluation_targets = targets(spec, sweep.zero_shot_targets)
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
            keep_winner(tracker, run_id, kind_of(cell.spec).apply_params(cell.spec, winner.params), child, results[0].reranking)
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


def keep_winner(tracker: Tracker, run_id: str, spec, child, tested) -> None:
    """A cell winner of a kind that keeps its result (an EAR trial: its reranker and the run of
    its chosen expansions) is kept as the trial of its parameters would be: ``orchestrate run``
    of that trial reuses it, a re-ranking trial with ``first_stage: {method: ear, run: FILE}``
    re-ranks its run. Where its kind reports its result itself, the cell run holds that trial
    file (``<kind>_trial.yaml``) and the report's comparison (``<kind>_comparison.json``; EAR's:
    BM25, RM3, first, concatenated, EAR, oracle)."""
    kind = kind_of(spec)
    if not kind.result_file:  # re-ranking cells keep their checkpoints only (storage.keep)
        return
    kept = kind.finished(spec)
    if kept is None:
        log.info("keeping %s's winner (%s)", spec.name, kind.name)
        kept = keep_result(kind, spec, child.data.tags[schema.CHECKPOINT_TAG], chosen_metrics(child.data.metrics), tested,
                           {k: v for k, v in child.data.metrics.items() if k.startswith("time_")})
    else:  # the same identity trained before (another run or sweep): its result is what later trials read
        earlier = json.loads((kept / kind.result_file).read_text()).get("test_ndcg_at_10")
        now = tested.evaluation.aggregate["ndcg_at_10"]
        if earlier is None or abs(earlier - now) > 1e-6:
            log.warning("%s: its winner's identity was kept before (%s, test nDCG@10 %s); this winner tests at %.4f: "
                        "trials that read the kept result read that one", spec.name, kept, earlier, now)
        else:
            log.info("%s: its winner's identity was kept before (%s): reused", spec.name, kept)
    tracker.set_tags(run_id, {schema.KEPT_TAG: str(kept)})
    if kind.report is not None:
        tracker.log_text(run_id, yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), f"{kind.name}_trial.yaml")
        tracker.log_json(run_id, "", f"{kind.name}_comparison.json", kind.report(spec, kept).comparison)
