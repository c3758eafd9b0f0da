"""A sweep's winners and what it keeps: after the search, each cell's best trial is tested on
every target with the lifecycle's :func:`~orchestrator.lifecycle.targets.submit_evaluations` and
:func:`~orchestrator.lifecycle.targets.log_target` on the cell run, which is then FINISHED; a
winner of a kind that keeps its result (EAR) is kept as the trial of its parameters would be.

What a sweep keeps on its storage (``storage.keep``, ``storage.log_models``) and how much: a
finished trial keeps its chosen and last epoch checkpoints; once a cell's winner is tested,
the other trials' Train runs go and the winner's model is logged to MLflow's artifact store.

A finished sweep's uncertainty on its cell runs, as MLflow metrics the UI compares
(:func:`log_cell_statistics`): once every cell is tested, each cell run of a system (a grid cell
over its seeds) gets, per evaluation target (``test`` and each zero-shot collection) and measure
of :data:`LOGGED_MEASURES`:

- ``<target>/<measure>_seed_mean``, ``_seed_std`` (several seeds only) and ``_seeds``: the
  system's mean over its seeds, their standard deviation and count;
- ``<target>/<measure>_difference``, ``_ci_low`` and ``_ci_high`` (not on baselines): the mean
  difference against the baseline (same model and size) and its paired bootstrap 95% interval,
  over queries x seeds.

MLflow keeps one value per run and metric, and the comparison of runs (a cell with each seed
its own run) shows these beside the cell's own ``test/ndcg_at_10``. The statistics are
:mod:`workloads.evaluation.statistics`', the same as the report's ``--ci`` (the report is not
imported: this reads the per-query values the cells stored).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import yaml

from orchestrator.core import schema
from orchestrator.core.execution import IN_EPOCH_DIR, init_ray, trial_capacity
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import test_data_identity
from orchestrator.lifecycle.run import keep_result
from orchestrator.lifecycle.targets import log_target, submit_evaluations, targets
from orchestrator.sweep.grid import Cell, SweepSpec
from orchestrator.sweep.search import COUNTED, TRAIN_RUN, optuna_storage
from workloads.core.logs import clock, get_logger
from workloads.evaluation import PRIMARY_METRIC
from workloads.evaluation.statistics import compare_uncertainty, seed_summary
from workloads.kinds import kind_of

log = get_logger("sweep")


def evaluate_winners(sweep, tracker, experiment_id, cells, cell_runs, paths, ray_address,
                      first_stage_validation: dict[str, dict[str, float]]) -> None:
    """Test every cell's winner (its best trial over all its trials) on every target with the
    lifecycle, all evaluations in flight at once. A cell already tested is tested again when its
    winner is no longer its best trial or its test data changed."""
    started = time.perf_counter()  # (the targets' data is prepared as the tests are submitted: counted)
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
    slots = cells_tested_at_once(pending)
    ends: list[float] = []  # seconds from the start of testing at which each cell's tests were seen ended
    for number, ((cell, run_id, winner, complete, child, jobs, test_data), ended_at) in enumerate(
            in_completion_order(pending, started), 1):
        ends.append(ended_at)
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
        # the search's progress line ends at its last trial; testing can take as long again (the demo)
        elapsed = time.perf_counter() - started
        log.info("%s (%s): winner trial %d val nDCG@10 %.4f, test nDCG@10 %.4f [%d/%d tested | testing %s, ETA %s]",
                 cell.key, "/".join(cell.axes.values()), winner.number, winner.value, test, number, len(pending),
                 clock(elapsed), clock(testing_eta(ends, len(pending), slots, elapsed)))
    keep_winners(sweep, tracker, cells, cell_runs, paths.ray_storage, paths.optuna_url)


def in_completion_order(pending: list[tuple], started: float) -> Iterator[tuple[tuple, float]]:
    """The cells whose tests are all in flight (``pending``'s 6th field: their PendingEvaluations),
    each as soon as every one of its tests has ended (or failed: its result raises), with when
    it was seen ended (seconds since ``started``; cells seen ended together share it). A cell
    is logged when it is done rather than in submission order."""
    import ray

    unfinished = {job.ref for entry in pending for job in entry[5]}
    left = list(pending)
    while left:
        if unfinished:  # one look over every test still running (a grid of 1,020 cells: one call, not one per cell)
            unfinished = set(ray.wait(list(unfinished), num_returns=len(unfinished), timeout=0, fetch_local=False)[1])
        done = [entry for entry in left if not any(job.ref in unfinished for job in entry[5])]
        if not done:  # wait until one more test ends
            ray.wait(list(unfinished), num_returns=1, fetch_local=False)
            continue
        seen = time.perf_counter() - started
        for entry in done:
            left.remove(entry)
            yield entry, seen


def cells_tested_at_once(pending: list[tuple]) -> int:
    """How many cells' tests run side by side: the cluster's room for one test task (a worker of
    the cell's shape: trial_capacity of a one-worker trial), over the tests each cell has."""
    if not pending:
        return 1
    shapes = {entry[0].spec.resources: entry[0].spec for entry in pending}  # the cluster asked once per shape
    tasks = min(trial_capacity(spec.model_copy(update={"resources": spec.resources.model_copy(update={"workers": 1})})).trials
                for spec in shapes.values())
    return max(1, tasks // max(len(entry[5]) for entry in pending))


def testing_eta(ends: list[float], cells: int, slots: int, now: float) -> float:
    """Seconds until the last of ``cells`` is tested, ``slots`` at a time, from when each cell so
    far was seen ended (``ends``, seconds from the start of testing; ``now`` likewise).

    A queue of ``slots`` servers: the i-th cell to end started when the (i - slots)-th ended (at
    0 for the first ``slots``), so its duration is the difference; each cell left takes the
    mean duration from when its slot frees, and ends no earlier than now. Pace alone (elapsed /
    ended x left) misleads here: in the bf16 demo the first of two cells tested side by side
    ended at 2m19s and pace said 11m38s left, when 4m44s were (this model: 4m38s)."""
    order = sorted(ends)
    durations = [end - (order[i - slots] if i >= slots else 0.0) for i, end in enumerate(order)]
    if not durations or len(order) >= cells:
        return 0.0
    mean = sum(durations) / len(durations)
    predicted = list(order)
    for i in range(len(order), cells):
        predicted.append(max(now, (predicted[i - slots] if i >= slots else 0.0) + mean))
    return max(0.0, predicted[-1] - now)


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


# ----------------------------------------------------------------------------- what a sweep keeps (storage.keep)

def keep_chosen_and_last(train_run: Path, chosen: str | Path) -> None:
    """Delete a trial's epoch checkpoints (``<train_run>/epoch-<n>``) but its chosen one (tested if
    it wins) and its last. Only for a trial its cell's study holds as COMPLETE: Ray Train's own
    record of the run still lists the deleted ones, so this run must never be fitted again."""
    epochs = sorted(Path(train_run).glob("epoch-*"), key=lambda d: int(d.name.rpartition("-")[2]))
    keep = {Path(chosen).name, epochs[-1].name if epochs else None}
    for directory in epochs:
        if directory.name not in keep:
            shutil.rmtree(directory, ignore_errors=True)


def keep_winners(sweep: SweepSpec, tracker: Tracker, cells: list[Cell], cell_runs: dict[str, str], ray_storage: Path,
                 optuna_url: str) -> None:
    """For every tested cell: its winner's model as the cell run's artifact (``storage.log_models``)
    and, with ``storage.keep: winners``, the other trials' checkpoints deleted. Idempotent, and
    done for cells tested by an earlier invocation too (a driver killed in between)."""
    for cell in cells:
        run = tracker.client.get_run(cell_runs[cell.key])
        winner_run = run.data.tags.get(schema.WINNER_TAG)
        if run.info.status != "FINISHED" or not winner_run:
            continue
        winner = tracker.client.get_run(winner_run)
        if sweep.storage.keep == "winners":  # also when the driver died before the trial logger trimmed it
            keep_chosen_and_last(ray_storage / winner.info.run_name, winner.data.tags[schema.CHECKPOINT_TAG])
        if sweep.storage.log_models and run.data.tags.get(schema.MODEL_TAG) != winner_run:
            tracker.log_model(run.info.run_id, Path(winner.data.tags[schema.CHECKPOINT_TAG]))
            tracker.set_tags(run.info.run_id, {schema.MODEL_TAG: winner_run})
        if sweep.storage.keep != "winners":
            continue
        study = optuna.load_study(study_name=cell.key, storage=optuna_storage(optuna_url))
        for trial in study.get_trials(deepcopy=False):
            ended = trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) or (
                trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs.get(COUNTED))  # never run again
            name = trial.user_attrs.get(TRAIN_RUN)
            if ended and name and name != winner.info.run_name:  # a trial run is named by its Train run
                shutil.rmtree(ray_storage / name, ignore_errors=True)


def checkpoint_disk_use(ray_storage: Path) -> dict:
    """Bytes the sweep's trials hold on its storage (checkpoints, in-epoch state), in all and per
    trial that holds any (``storage.keep`` decides what stays)."""
    sizes = []
    if ray_storage.is_dir():
        for run in ray_storage.iterdir():  # a Train run per trial: epoch-<n>/ checkpoints, in-epoch state
            if run.is_dir() and (any(run.glob("epoch-*")) or (run / IN_EPOCH_DIR).exists()):
                sizes.append(sum(f.stat().st_size for f in run.rglob("*") if f.is_file()))
    return {"disk_bytes": sum(sizes), "disk_trials": len(sizes),
            "disk_per_trial_bytes": sum(sizes) / len(sizes) if sizes else None}


# ----------------------------------------------------------------------------- the cells' statistics over seeds


LOGGED_MEASURES = (PRIMARY_METRIC,)  # one measure: 6 numbers per target, not 6 per measure in every cell's charts
SYSTEM_AXES = ("model", "loss", "augmentation", "size")


def _per_query(tracker: Tracker, run, prefixes: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """prefix -> metric -> query -> value of one run (the prefixes it has)."""
    artifacts = tracker.run_artifacts(run)
    listed = {Path(a.path).name for a in artifacts.list_artifacts("per_query")}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for prefix in prefixes:
            name = f"{prefix.rstrip('_')}.json"
            if name in listed:
                out[prefix] = json.loads(Path(artifacts.download_artifacts(f"per_query/{name}", tmp)).read_text())["per_query"]
    return out


def cell_statistics(systems: dict[tuple, dict], prefixes: list[str], measures=LOGGED_MEASURES) -> dict[tuple, dict[str, float]]:
    """System key (SYSTEM_AXES values) -> its metrics (code names, ``test_ndcg_at_10_ci_low``).

    ``systems``: key -> {"baseline": bool, "seeds": {seed: {prefix: {metric: {query: value}}}}}.
    A system gets a target's numbers when every seed has it; a comparison when its baseline
    (same model and size) has it too."""
    def per_seed(system: dict, prefix: str, metric: str) -> dict[str, dict[str, float]] | None:
        values = {seed: by_prefix.get(prefix, {}).get(metric) for seed, by_prefix in system["seeds"].items()}
        return None if not values or any(v is None for v in values.values()) else values

    out: dict[tuple, dict[str, float]] = {}
    for key, system in systems.items():
        baseline = next((s for k, s in systems.items() if s["baseline"] and k[0] == key[0] and k[3] == key[3]), None)
        metrics: dict[str, float] = {}
        for prefix in prefixes:
            for metric in measures:
                mine = per_seed(system, prefix, metric)
                if mine is None:
                    continue
                summary = seed_summary(mine)
                name = f"{prefix}{metric}"
                metrics[f"{name}_seed_mean"] = summary.mean
                metrics[f"{name}_seeds"] = float(summary.count)
                if summary.std is not None:
                    metrics[f"{name}_seed_std"] = summary.std
                theirs = per_seed(baseline, prefix, metric) if baseline is not None and not system["baseline"] else None
                if theirs is not None:
                    uncertainty = compare_uncertainty(mine, theirs)
                    metrics[f"{name}_difference"] = uncertainty.difference
                    metrics[f"{name}_ci_low"] = uncertainty.interval.low
                    metrics[f"{name}_ci_high"] = uncertainty.interval.high
        out[key] = metrics
    return out


def log_cell_statistics(sweep: SweepSpec, tracker: Tracker, experiment_id: str) -> int:
    """Log every finished system's statistics on its cell runs; the number of runs logged to."""
    runs = tracker.client.search_runs([experiment_id], filter_string=f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'",
                                      max_results=50_000)
    by_key = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in runs}
    prefixes = [schema.target_prefix(schema.TEST)] + [schema.target_prefix(t.name) for t in sweep.zero_shot]
    systems: dict[tuple, dict] = {}
    members: dict[tuple, list[str]] = {}
    incomplete = set()
    for cell in sweep.cells:
        key = tuple(cell.axes.get(a, "") for a in SYSTEM_AXES)
        run = by_key.get(cell.key)
        if cell.spec is None or run is None or run.info.status != "FINISHED":
            incomplete.add(key)
            continue
        system = systems.setdefault(key, {"baseline": cell.is_baseline, "seeds": {}})
        system["seeds"][cell.axes.get("seed", "")] = _per_query(tracker, run, prefixes)
        members.setdefault(key, []).append(run.info.run_id)
    complete = {k: v for k, v in systems.items() if k not in incomplete}
    try:
        statistics = cell_statistics(complete, prefixes)
    except ValueError as exc:  # seeds scored on different queries: the results stay as they are, the report says why
        log.warning("%s: no seeds' statistics or intervals logged to the cell runs: %s", sweep.name, exc)
        return 0
    logged = 0
    for key, metrics in statistics.items():
        for run_id in members[key] if metrics else []:
            tracker.log_metrics(run_id, metrics)
            logged += 1
    log.info("%s: seeds' mean and spread, and intervals against the baselines, logged to %d cell runs", sweep.name, logged)
    return logged
