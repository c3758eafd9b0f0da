"""The tracking store at doc19's scale: what building it costs, and how long a researcher waits on it.

A doc19-shaped MLflow store is written THROUGH THE PROJECT'S OWN CODE, with synthetic values and
no training: the grid is ``search_spaces/doc19.yaml`` expanded by ``orchestrator.sweep.grid``
(765 cells over its three seeds, the real cell keys, axes and specs; ``--scale 0.333``: 255, one
seed's size); the Optuna studies are the sweep's own
``CellStudiesSearcher`` (one study per cell in ``<storage>/doc19/optuna.db``, TPE asked, every
epoch reported, trials told); each trial run is written by the sweep's own Tune callback
(``MlflowTrialLogger``, fed fake Tune trial objects: full flattened spec params, per-epoch
metrics at step = epoch, the training summary, the checkpoint tag); the supervised selectors (90; 30 per seed)
are written with the calls of ``orchestrator.lifecycle.run.ensure_requirement``; cell runs come from
``runner._cell_runs``; each cell's winner is "tested" the way ``winners.evaluate_winners`` logs it
(``orchestrator.lifecycle.targets.log_target`` on the test target and the six zero-shot targets: aggregates,
per-query JSON, BM25 per-query JSON, the query texts, both TREC runs; winner tags, params), then
the sweep run is closed and its default report logged (``orchestrator.cli.sweep.log_default_report``).
Synthetic per-query values average exactly to the logged aggregates (the report cross-checks).
Query counts: TREC DL 2019 doc judged 43; zero-shot the collections' real test counts (scifact
300, fiqa 648, dbpedia-entity 400, trec-covid 50, nfcorpus 323, robust04 249). Not written: the
winners' models (``storage.log_models``; ~440 MB per BERT-base cell, a file copy per cell) and
Ray's checkpoints (status sees 0 bytes of them). Each selector's "trained" marker is written in
the workdir's cache (``$ORCHESTRATE_CACHE_DIR``) so status counts them trained.

Then, each several times (median): ``orchestrate status``, ``orchestrate report --zero-shot``
(tables, t-tests, figures), ``orchestrate compare`` on two cells (all as subprocesses of the
real CLI with ``--tracking-uri``/``--storage``), and the MLflow UI (``orchestrate ui FILE`` starts
``mlflow server``): the REST calls its run list makes (runs/search, 100 per page, newest first;
the cells-only filter ``orchestrate ui`` links to; every page), its compare page for every cell
(runs/get per run, 6 in parallel like a browser, and one at a time), and, where Chromium and
chromedriver exist, a headless browser loading the run list until rows render. ``--profile``
also runs status and report once under cProfile and attributes their time (MLflow, Optuna,
plotting, the project). ``--postgres URI`` builds the same store in PostgreSQL and times the
same calls there.

    ORCHESTRATE_DATA_DIR=/path/to/data HF_HUB_OFFLINE=1 python benchmarks/tracking_scale.py \
        [--scale 0.1] [--workdir DIR] [--rebuild] [--repeats 3] [--profile] [--postgres postgresql://u:p@host/db]

The store is built once into ``--workdir`` (default: a new temporary directory) and reused by
later invocations with the same workdir (``--rebuild`` starts afresh). A PostgreSQL cluster for
``--postgres``: ``apt-get install -y postgresql``, ``pip install psycopg2-binary``,
``pg_ctlcluster <version> main start``, ``createuser``/``createdb`` as the postgres user; with SQLAlchemy 2.1 a plain
``postgresql://`` URI means psycopg 3, so give ``postgresql+psycopg2://user:password@127.0.0.1:5432/db``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

SWEEP_FILE = REPO / "search_spaces" / "doc19.yaml"
TEST_QUERIES = 43  # TREC DL 2019 document, judged queries
ZERO_SHOT_QUERIES = {"scifact": 300, "fiqa": 648, "dbpedia-entity": 400, "trec-covid": 50, "nfcorpus": 323,
                     "trec-robust-2004": 249}  # the collections' test queries
TARGETS_SECONDS = {"status": 5.0, "report": 60.0, "ui run list": 10.0}


# ----------------------------------------------------------------------------- synthetic values


def _rng(*parts):
    import numpy as np

    from workloads.core.paths import stable_key

    return np.random.default_rng(int(stable_key(*parts), 16) % 2**63)


def evaluation(ndcg, queries: list[str]):
    """An Evaluation whose every measure is derived from ``ndcg`` per query; aggregates are the
    plain means of the per-query values (what the report recomputes)."""
    import numpy as np

    from workloads import evaluation as measures
    from workloads.evaluation import Evaluation

    names = getattr(measures, "RERANKING_MEASURES", tuple(measures.MEASURES))  # what a trial measures on every target

    ndcg = np.clip(ndcg, 0.0, 1.0)
    derived = {"ndcg_at_10": ndcg, "ndcg_at_20": np.clip(ndcg * 0.97 + 0.02, 0, 1), "rr_at_10": np.clip(ndcg * 1.25, 0, 1),
               "rr_at_100": np.clip(ndcg * 1.25 + 0.01, 0, 1), "ap": ndcg * 0.6, "map_at_20": ndcg * 0.55,
               "p_at_1": (ndcg > 0.45).astype(float)}
    per_query = {m: dict(zip(queries, map(float, derived[m]))) for m in names}
    aggregate = {m: sum(v.values()) / len(v) for m, v in per_query.items()}
    return Evaluation(aggregate, per_query, 1, len(queries))


class Collections:
    """Each evaluation target's queries, BM25 per-query values, runs and query-text file (shared
    by every cell: one first stage per target)."""

    def __init__(self, names: list[str], root: Path, depth: int):
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        from workloads.retrieval.bm25 import write_trec_run

        root.mkdir(parents=True, exist_ok=True)
        self.queries, self.difficulty, self.bm25, self.run, self.bm25_file, self.candidates = {}, {}, {}, {}, {}, {}
        for name in names:
            label = name.removeprefix("zs_").removesuffix("_test")
            count = TEST_QUERIES if name == "test" else ZERO_SHOT_QUERIES[label]
            queries = [f"{1_000_000 + i}" if name == "test" else f"{label}-{i:04d}" for i in range(count)]
            rng = _rng("difficulty", name)
            self.queries[name] = queries
            self.difficulty[name] = rng.uniform(0.05, 0.75, count)
            self.bm25[name] = evaluation(self.difficulty[name] - 0.05 + rng.normal(0, 0.05, count), queries)
            scores = np.linspace(30.0, 10.0, depth)
            self.run[name] = {q: {f"D{i}-{r}": float(s) for r, s in enumerate(scores)} for i, q in enumerate(queries)}
            self.bm25_file[name] = root / f"{name}.bm25.trec"
            write_trec_run(self.run[name], self.bm25_file[name], tag="bm25")
            self.candidates[name] = root / f"{name}.candidates.parquet"
            pq.write_table(pa.table({"query_id": queries, "query": [f"synthetic query {q} of {label}" for q in queries]}),
                           self.candidates[name])

    def system(self, name: str, quality: float, *seed):
        """A system's evaluation on target ``name``: the shared difficulty, shifted by ``quality``."""
        difficulty = self.difficulty[name]
        return evaluation(difficulty + quality + _rng("system", name, *seed).normal(0, 0.06, len(difficulty)), self.queries[name])


def cell_quality(axes: dict[str, str]) -> float:
    size = axes.get("size", "100")
    quality = 0.012 * math.log10(float(size) if size != "full" else 1e6)
    quality += {"none": 0.0, "bm25": 0.012, "glove": 0.006, "attention": 0.018, "linear": 0.015}.get(axes.get("augmentation"), 0.0)
    quality += {"bert-base-uncased": 0.01, "roberta-base": 0.012, "distilbert-base-uncased": 0.0}.get(axes.get("model"), 0.0)
    return quality


def epoch_metrics(epochs: int, validation: float, trial: int, contrastive: bool, *seed) -> list[dict[str, float]]:
    """What the training loop reports per epoch (``workloads.training``): epoch, losses, timings,
    every ``val_*`` measure. Epoch 1 rises with the trial number so no trial is pruned (the cell's
    median pruner compares epoch 1)."""
    rng = _rng("epochs", *seed)
    out = []
    for epoch in range(1, epochs + 1):
        ndcg = validation + (0.003 * trial if epoch == 1 else float(rng.normal(0.012, 0.01)))
        metrics = {"epoch": float(epoch), "train_loss": float(1.0 / epoch + rng.uniform(0, 0.05)),
                   "epoch_train_seconds": float(rng.uniform(600, 900)), "degenerate_batches": 0.0,
                   "val_ndcg_at_10": ndcg, "val_ndcg_at_20": ndcg * 0.97 + 0.02, "val_rr_at_10": ndcg * 1.25,
                   "val_rr_at_100": ndcg * 1.25 + 0.01, "val_ap": ndcg * 0.6, "val_map_at_20": ndcg * 0.55,
                   "val_p_at_1": ndcg * 0.9, "epoch_validation_seconds": float(rng.uniform(100, 140)),
                   "epoch_checkpoint_seconds": float(rng.uniform(3, 6))}
        if epoch == 1:
            metrics.update({"epoch_startup_seconds": float(rng.uniform(5, 15)), "epoch_setup_seconds": float(rng.uniform(20, 60))})
        if contrastive:
            metrics.update({"train_ranking_loss": metrics["train_loss"] * 0.7, "train_contrastive_loss": metrics["train_loss"] * 0.3})
        out.append(metrics)
    return out


# ----------------------------------------------------------------------------- building the store


def sweep_and_cells(args):
    from orchestrator.sweep.grid import expand_grid, load_sweep

    sweep = load_sweep(SWEEP_FILE)
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    count = max(1, round(len(cells) * args.scale))
    return sweep, cells[:count]


def build_store(uri: str, storage_root: Path, work: Path, args) -> dict:
    """Write the doc19 store through the project's tracking code; returns seconds per phase."""
    from orchestrator.cli.sweep import log_default_report
    from orchestrator.core import schema
    from orchestrator.core.execution import EpochResult
    from orchestrator.core.tracking import Tracker
    from orchestrator.lifecycle.identity import test_data_identity, trial_key
    from orchestrator.lifecycle.run import log_training, timing, training_summary
    from orchestrator.lifecycle.targets import Target, TargetResult, collection_label, log_target, targets
    from orchestrator.sweep.dry_run import experiment_description
    from orchestrator.sweep.runner import _cell_runs, migrate_trial_axes
    from orchestrator.sweep.search import TRAIN_RUN, CellStudiesSearcher
    from orchestrator.sweep.store import bind_store, sweep_paths
    from orchestrator.sweep.tune import MlflowTrialLogger, SweepProgress, reconcile_trial_runs
    from workloads.evaluation.reranking import Reranking
    from workloads.kinds import choose_epoch, kind_of, requirements
    from workloads.kinds.selector.spec import COMPLETE_MARKER, selector_dir

    phases: dict[str, float] = {}
    started = time.perf_counter()
    sweep, cells = sweep_and_cells(args)
    sweep = sweep.model_copy(update={"search": sweep.search.model_copy(update={"trials_per_cell": args.trials})})
    paths = sweep_paths(sweep, storage_root)
    paths.root.mkdir(parents=True, exist_ok=True)
    names = [t.name for t in targets(cells[0].spec, sweep.zero_shot_targets)]
    collections = Collections(names, work / "collections", args.run_depth)
    phases["synthetic collections (not tracking)"] = time.perf_counter() - started

    tracker = Tracker(uri)
    mark = time.perf_counter()
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    bind_store(sweep, paths, tracker, experiment)
    experiment_id = tracker.experiment_id(sweep.name)
    bind_store(sweep, paths, tracker, tracker.client.get_experiment(experiment_id))
    tracker.client.set_experiment_tag(experiment_id, schema.NOTE_TAG, experiment_description(sweep, cells))
    root = tracker.sweep_run(experiment_id, sweep.name)
    tracker.client.update_run(root, status="RUNNING")

    # selectors (orchestrator.lifecycle.run_trial's tracking calls, without training)
    selectors = requirements([c.spec for c in cells])
    for number, selector in enumerate(selectors):
        kind = kind_of(selector)
        run_id = tracker.start_trial_run(experiment_id, selector.name, trial_key(selector), schema.flat_params(selector),
                                         {**kind.requirement_tags(selector), schema.PARENT_TAG: root, schema.SWEEP_TAG: sweep.name},
                                         kind=kind.name)
        tracker.log_json(run_id, "", "config.json", selector.model_dump(mode="json"))
        tracker.log_json(run_id, "", "data_stats.json", {"pairs": selector.training_data.size, "queries": 100})
        tracker.log_metrics(run_id, collections.bm25["test"].aggregate, prefix=schema.first_stage_prefix("val"))
        metrics = epoch_metrics(args.epochs, 0.3, 0, False, "selector", number)
        summary = log_training(tracker, run_id, [EpochResult(m, f"/checkpoints/{selector.name}/epoch-{int(m['epoch'])}")
                                                       for m in metrics])
        own = selector.data.test_collection or selector.data.collection
        tested = collections.system("test", 0.01, "selector", number)
        target = Target(schema.TEST, collection_label(own, selector.data.test_split), selector.as_rerank_trial())
        log_target(tracker, run_id, TargetResult(target, Reranking(tested, collections.run["test"]), collections.bm25["test"],
                                                 str(collections.bm25_file["test"]), str(collections.candidates["test"])),
                   run_tag=f"rerank-lab.{selector.name}")
        tracker.log_metrics(run_id, {**summary, **timing(3000.0, summary), schema.TIME_PREPARE: 60.0, schema.TIME_EVALUATION: 30.0,
                                     schema.TIME_TRIAL: 3100.0, schema.EPOCHS_RUN: float(len(metrics))})
        kept = selector_dir(selector)
        kept.mkdir(parents=True, exist_ok=True)
        (kept / COMPLETE_MARKER).write_text(json.dumps(summary))  # status: "trained"
        tracker.set_tags(run_id, {schema.CHECKPOINT_TAG: str(kept)})
        tracker.finish(run_id, "FINISHED")
    phases[f"{len(selectors)} selector runs"] = time.perf_counter() - mark

    # cell runs (the runner's own), their data's first stage
    mark = time.perf_counter()
    cell_runs = _cell_runs(tracker, experiment_id, sweep, cells)
    migrate_trial_axes(tracker, experiment_id, cell_runs)
    for cell in cells:
        run = tracker.client.get_run(cell_runs[cell.key])
        if f"{schema.first_stage_prefix('val')}ndcg_at_10" not in run.data.metrics:
            tracker.log_metrics(run.info.run_id, collections.bm25["test"].aggregate, prefix=schema.first_stage_prefix("val"))
            tracker.log_json(run.info.run_id, "", "data_stats.json", {"pairs": int(cell.axes["size"]), "queries": 500})
    phases[f"{len(cells)} cell runs"] = time.perf_counter() - mark

    # the search: the sweep's searcher (Optuna) and its Tune callback (MLflow), fed fake Tune trials
    mark = time.perf_counter()
    searcher = CellStudiesSearcher(cells, sweep.search, paths.optuna_url)
    searcher.storage = str(paths.ray_storage)
    reconcile_trial_runs(tracker, experiment_id, searcher)
    phases[f"{len(cells)} Optuna studies opened"] = time.perf_counter() - mark
    mark = time.perf_counter()
    display = SweepProgress(sweep.name, {c.key: 0 for c in cells}, args.trials, enabled=False)
    logger = MlflowTrialLogger(tracker, experiment_id, cell_runs, sweep, display, searcher)
    by_key = {c.key: c for c in cells}
    pruned = trial_count = 0
    while True:
        trial_id = f"tune-{trial_count:05d}"
        config = searcher.suggest(trial_id)
        if config is None or config == searcher.FINISHED:
            break
        trial_count += 1
        trial = SimpleNamespace(trial_id=trial_id, config=config, last_result=None, error_msg=None)
        cell = by_key[config["cell"]]
        logger.on_trial_start(0, [], trial)
        metrics = epoch_metrics(args.epochs, 0.25 + cell_quality(cell.axes), config["optuna_trial"],
                                cell.spec.loss.contrastive != "none", cell.key, config["optuna_trial"])
        for epoch in metrics:
            result = {**epoch, "training_iteration": int(epoch["epoch"]), "trial_id": trial_id, "time_this_iter_s": 1.0}
            searcher.on_trial_result(trial_id, result)
            logger.on_trial_result(0, [], trial, result)
            trial.last_result = result
            if trial_id in searcher.pruning:  # the cell's pruner stopped it: the trial reports where it stopped
                result = {schema.PRUNED_TAG: int(epoch["epoch"]), schema.OBJECTIVE: epoch[schema.OBJECTIVE]}
                searcher.on_trial_result(trial_id, result)
                logger.on_trial_result(0, [], trial, result)
                pruned += 1
                break
        else:
            summary = training_summary(metrics)
            best = metrics[choose_epoch(metrics)]
            result = {**summary, **timing(4000.0, summary), schema.OBJECTIVE: best[schema.OBJECTIVE], "final": 1,
                      schema.CHECKPOINT_TAG: f"{paths.ray_storage}/{config['train_run']}/epoch-{int(best['epoch'])}"}
            searcher.on_trial_result(trial_id, result)
            logger.on_trial_result(0, [], trial, result)
        trial.last_result = result
        searcher.on_trial_complete(trial_id, result)
        logger.on_trial_complete(0, [], trial)
    phases[f"{trial_count} trial runs ({pruned} pruned) with Optuna"] = time.perf_counter() - mark

    # the winners, tested (winners.evaluate_winners' calls, the evaluation itself synthetic)
    import optuna

    mark = time.perf_counter()
    zero_shot = sweep.zero_shot_targets
    for cell in cells:
        run_id = cell_runs[cell.key]
        study = optuna.load_study(study_name=cell.key, storage=paths.optuna_url)
        complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
        winner = max(complete, key=lambda t: t.value)
        child = tracker.find_run(experiment_id, f"{cell.key}/{winner.user_attrs[TRAIN_RUN]}")
        spec = kind_of(cell.spec).apply_params(cell.spec, winner.params)
        evaluation_targets = targets(spec, zero_shot)
        test_data = test_data_identity(evaluation_targets)
        tracker.client.get_run(run_id)
        quality = cell_quality(cell.axes)
        for target in evaluation_targets:
            tested = collections.system(target.name, quality, cell.key)
            log_target(tracker, run_id, TargetResult(target, Reranking(tested, collections.run[target.name]),
                                                     collections.bm25[target.name], str(collections.bm25_file[target.name]),
                                                     str(collections.candidates[target.name])),
                       run_tag=f"rerank-lab.{sweep.name}.{cell.key}")
        tracker.log_metrics(run_id, {schema.BEST_OBJECTIVE: winner.value, schema.TRIALS_COMPLETE: len(complete)})
        tracker.set_tags(run_id, {schema.WINNER_TAG: child.info.run_id, schema.WINNER_PARAMS_TAG: str(winner.params),
                                  schema.TEST_DATA_TAG: test_data})
        tracker.set_tags(child.info.run_id, {schema.WINNER_TAG: "true"})
        tracker.log_new_params(run_id, schema.comparison_params(cell.axes, winner.params))
        tracker.finish(run_id, "FINISHED")
        tracker.run_metrics(run_id)
    phases[f"{len(cells)} winners tested ({len(names)} targets each)"] = time.perf_counter() - mark

    tracker.finish(root)
    mark = time.perf_counter()
    try:
        log_default_report(sweep, tracker)
        phases["the sweep's default report logged"] = time.perf_counter() - mark
    except Exception as exc:  # the store is complete without it; say why it is missing
        phases[f"the sweep's default report FAILED ({type(exc).__name__}: {str(exc)[:120]})"] = time.perf_counter() - mark
    phases["total"] = time.perf_counter() - started
    (work / f"built-{store_name(uri)}.json").write_text(json.dumps({"phases": phases, "cells": len(cells), "trials": trial_count,
                                                                     "selectors": len(selectors), "args": vars(args)}, indent=1))
    return phases


def store_name(uri: str) -> str:
    return "postgresql" if uri.startswith("postgresql") else "sqlite"


def reset_postgres(uri: str) -> None:
    """An empty database (every table dropped): --rebuild on PostgreSQL."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public;"))
    engine.dispose()


# ----------------------------------------------------------------------------- timing the commands


def env() -> dict[str, str]:
    return dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def cli(*arguments: str, profile: Path | None = None) -> tuple[float, str]:
    """One ``orchestrate`` command as a subprocess: its wall seconds and its output."""
    command = [sys.executable, *(["-m", "cProfile", "-o", str(profile)] if profile else []), "-m", "orchestrator.cli", *arguments]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env(), capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(arguments[:2])} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def timed(label: str, store: str, repeats: int, call, target: float | None = None, **extra) -> dict:
    seconds = []
    for _ in range(repeats):
        seconds.append(call())
    row = {"operation": label, "store": store, "median_seconds": statistics.median(seconds), "runs": seconds, "target_seconds": target,
           "met": None if target is None else statistics.median(seconds) < target, **extra}
    print(f"  {label} [{store}]: median {row['median_seconds']:.3f}s of {[round(s, 3) for s in seconds]}", flush=True)
    return row


def time_commands(uri: str, storage: Path, work: Path, args, store: str) -> tuple[list[dict], dict]:
    import mlflow

    from orchestrator.core import schema

    rows, notes = [], {}
    tracking = ["--tracking-uri", uri, "--storage", str(storage)]
    _, output = cli("status", str(SWEEP_FILE), *tracking)
    notes["status_output"] = output.strip().splitlines()[:3]
    rows.append(timed("orchestrate status doc19.yaml", store, args.repeats,
                      lambda: cli("status", str(SWEEP_FILE), *tracking)[0], TARGETS_SECONDS["status"]))
    report_out = work / f"reports-{store}"
    report = ["report", str(SWEEP_FILE), "--zero-shot", "--out", str(report_out), *tracking]
    _, output = cli(*report)
    notes["report_head"] = [line for line in output.splitlines() if line.startswith("|")][:4]
    notes["report_files"] = len(list(report_out.rglob("*.*")))
    rows.append(timed("orchestrate report doc19.yaml --zero-shot (tables, t-tests, figures)", store, args.repeats,
                      lambda: cli(*report)[0], TARGETS_SECONDS["report"]))
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("doc19")
    cells = client.search_runs([experiment.experiment_id], f"tags.`{schema.KIND_TAG}` = 'cell'", max_results=1000,
                               order_by=["attributes.start_time ASC"])
    a, b = cells[0].info.run_id, cells[min(2, len(cells) - 1)].info.run_id
    notes["compare"] = f"{cells[0].info.run_name} vs {cells[min(2, len(cells) - 1)].info.run_name}"
    rows.append(timed("orchestrate compare CELL_A CELL_B", store, args.repeats,
                      lambda: cli("compare", a, b, "--tracking-uri", uri)[0]))
    rows.append(timed("orchestrate compare CELL_A CELL_B --collection fiqa", store, args.repeats,
                      lambda: cli("compare", a, b, "--collection", "fiqa", "--tracking-uri", uri)[0]))
    if args.profile:
        notes["profile"] = {name: profile_command(work / f"{name}-{store}.prof", command) for name, command in (
            ("status", ["status", str(SWEEP_FILE), *tracking]), ("report", report))}
    return rows, notes


PROFILE_GROUPS = {  # (file fragment, function) whose cumulative time is reported
    "mlflow search_runs": ("mlflow/tracking/client.py", "search_runs"),
    "mlflow get_run": ("mlflow/tracking/client.py", "get_run"),
    "mlflow list_artifacts": ("mlflow/tracking/client.py", "list_artifacts"),
    "mlflow download_artifacts": ("mlflow/tracking/client.py", "download_artifacts"),
    "mlflow get_experiment_by_name": ("mlflow/tracking/client.py", "get_experiment_by_name"),
    "mlflow store _search_runs (SQL + entities)": ("mlflow/store/tracking/sqlalchemy_store.py", "_search_runs"),
    "mlflow to_mlflow_entity": ("mlflow/store/tracking/dbmodels/models.py", "to_mlflow_entity"),
    "optuna load_study": ("optuna/study/study.py", "load_study"),
    "optuna get_all_study_summaries": ("optuna/study/study.py", "get_all_study_summaries"),
    "optuna get_trials": ("optuna/study/study.py", "get_trials"),
    "project expand_grid": ("orchestrator/sweep/grid.py", "expand_grid"),
    "project load_sweep": ("orchestrator/sweep/grid.py", "load_sweep"),
    "project dry_run_report": ("orchestrator/sweep/dry_run.py", "dry_run_report"),
    "project progress (Optuna per cell)": ("orchestrator/sweep/dry_run.py", "progress"),
    "project load_sweep_results": ("orchestrator/report/results.py", "load_sweep_results"),
    "project RunReader._load (per-query artifacts)": ("orchestrator/report/results.py", "_load"),
    "project grid_table": ("orchestrator/report/tables.py", "grid_table"),
    "project zero_shot_table": ("orchestrator/report/tables.py", "zero_shot_table"),
    "project _plots (matplotlib)": ("orchestrator/report/build.py", "_plots"),
    "project selector_block": ("orchestrator/report/build.py", "selector_block"),
    "project search_line": ("orchestrator/report/build.py", "search_line"),
    "project sweep_status": ("orchestrator/sweep/status.py", "sweep_status"),
    "project main": ("orchestrator/cli/__init__.py", "main"),
}


def profile_command(path: Path, arguments: list[str]) -> dict:
    """One run under cProfile: its wall seconds and the cumulative seconds of the functions that matter."""
    import pstats

    seconds, _ = cli(*arguments, profile=path)
    stats = pstats.Stats(str(path)).stats
    out = {"wall_seconds": round(seconds, 3)}
    for label, (fragment, function) in PROFILE_GROUPS.items():
        entries = [(v[1], v[3]) for (file, _, name), v in stats.items() if name == function and fragment in file]
        if entries:
            out[label] = {"calls": sum(e[0] for e in entries), "cumulative_seconds": round(max(e[1] for e in entries), 3)}
    top = sorted(((v[3], f"{Path(k[0]).name}:{k[1]}:{k[2]}") for k, v in stats.items()), reverse=True)
    out["top_cumulative"] = [f"{s:.2f}s {name}" for s, name in top[:25]]
    tottime = sorted(((v[2], f"{k[0]}:{k[1]}:{k[2]}", v[1]) for k, v in stats.items()), reverse=True)
    out["top_own_time"] = [f"{s:.2f}s {name} ({calls} calls)" for s, name, calls in tottime[:15]]
    return out


# ----------------------------------------------------------------------------- the MLflow UI


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(base: str, path: str, payload: dict) -> bytes:
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return response.read()


def get(base: str, path: str) -> bytes:
    with urllib.request.urlopen(f"{base}{path}", timeout=600) as response:
        return response.read()


def time_ui(uri: str, work: Path, args, store: str) -> tuple[list[dict], dict]:
    """``orchestrate ui doc19.yaml`` (an ``mlflow server``), then the REST calls its pages make."""
    from orchestrator.core import schema

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(work / f"ui-{store}.log", "w")
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(SWEEP_FILE), "--tracking-uri", uri, "--port", str(port)],
                              cwd=REPO, env=env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rows, notes = [], {}
    try:
        while True:
            try:
                get(base, "/health")
                break
            except OSError:
                if server.poll() is not None or time.perf_counter() - started > 180:
                    raise RuntimeError(f"the MLflow server did not start: see {work / f'ui-{store}.log'}") from None
                time.sleep(0.25)
        notes["server_start_seconds"] = time.perf_counter() - started
        experiment = json.loads(get(base, "/ajax-api/2.0/mlflow/experiments/get-by-name?experiment_name=doc19"))["experiment"]
        eid = experiment["experiment_id"]
        listing = {"experiment_ids": [eid], "filter": "", "run_view_type": "ACTIVE_ONLY", "max_results": 100,
                   "order_by": ["attributes.start_time DESC"]}
        cells_filter = {**listing, "filter": f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'"}
        first = json.loads(post(base, "/ajax-api/2.0/mlflow/runs/search", listing))
        notes["run_list_first_page_bytes"] = len(json.dumps(first))
        notes["newest_run"] = first["runs"][0]["info"].get("run_name")
        cells_first = json.loads(post(base, "/ajax-api/2.0/mlflow/runs/search", cells_filter))
        # nested runs show under their parents: any run name of either first page (a cell's, mostly) is a rendered row
        names = ["sweep doc19", *(r["info"].get("run_name") for r in first["runs"] + cells_first.get("runs", []))]

        def search(payload: dict) -> float:
            mark = time.perf_counter()
            post(base, "/ajax-api/2.0/mlflow/runs/search", payload)
            return time.perf_counter() - mark

        def every_page() -> float:
            mark, token, count = time.perf_counter(), None, 0
            while True:
                page = json.loads(post(base, "/ajax-api/2.0/mlflow/runs/search", {**listing, **({"page_token": token} if token else {})}))
                count += len(page.get("runs", []))
                token = page.get("next_page_token")
                if not token:
                    notes["runs_in_experiment"] = count
                    return time.perf_counter() - mark

        rows.append(timed("UI run list: runs/search, 100 newest", store, args.repeats, lambda: search(listing),
                          TARGETS_SECONDS["ui run list"]))
        rows.append(timed("UI cells only: runs/search kind = cell, 100", store, args.repeats, lambda: search(cells_filter),
                          TARGETS_SECONDS["ui run list"]))
        rows.append(timed("UI every page of the run list (100 per page)", store, args.repeats, every_page))
        cell_ids, token = [], None
        while True:
            page = json.loads(post(base, "/ajax-api/2.0/mlflow/runs/search", {**cells_filter, "max_results": 1000,
                                                                             **({"page_token": token} if token else {})}))
            cell_ids += [r["info"]["run_id"] for r in page.get("runs", [])]
            token = page.get("next_page_token")
            if not token:
                break
        notes["cells_compared"] = len(cell_ids)

        def compare(workers: int) -> float:
            mark = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda run_id: get(base, f"/ajax-api/2.0/mlflow/runs/get?run_id={run_id}"), cell_ids))
            return time.perf_counter() - mark

        rows.append(timed(f"UI compare page: runs/get x {len(cell_ids)}, 6 parallel", store, args.repeats, lambda: compare(6)))
        rows.append(timed(f"UI compare page: runs/get x {len(cell_ids)}, sequential", store, args.repeats, lambda: compare(1)))
        if not args.no_browser and Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists():
            try:
                rows += time_browser(base, eid, names, args, store, notes)
            except Exception as exc:  # optional: the REST timings are the measurement
                notes["browser_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  headless browser not timed: {notes['browser_error']}", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()
    return rows, notes


def time_browser(base: str, eid: str, names: list[str], args, store: str, notes: dict) -> list[dict]:
    """Headless Chromium opening the run list until a row of its first page (a run name) is on screen."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    rendered = ("const text = document.body ? document.body.innerText : ''; "
                "return arguments[0].filter(n => n && text.includes(n)).length;")

    def load(url: str) -> float:
        driver.get("about:blank")
        mark = time.perf_counter()
        driver.get(url)
        WebDriverWait(driver, 90, poll_frequency=0.05).until(lambda d: d.execute_script(rendered, names))
        seconds = time.perf_counter() - mark
        notes["browser_run_names_visible"] = driver.execute_script(rendered, names)
        return seconds

    try:
        try:
            load(f"{base}/#/experiments/{eid}/runs")  # the first load fetches the UI's scripts
        except Exception:
            (Path(args.workdir or tempfile.gettempdir()) / f"browser-{store}.txt").write_text(driver.execute_script(
                "return document.body ? document.body.innerText : ''"))
            raise
        return [timed("browser: run list page until rows render", store, args.repeats,
                      lambda: load(f"{base}/#/experiments/{eid}/runs"), TARGETS_SECONDS["ui run list"])]
    finally:
        driver.quit()


# ----------------------------------------------------------------------------- main


def table(rows: list[dict]) -> str:
    lines = ["| operation | store | median s | runs | target | met? |", "|---|---|---:|---|---|---|"]
    for r in rows:
        target = f"< {r['target_seconds']:g} s" if r["target_seconds"] else "-"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        lines.append(f"| {r['operation']} | {r['store']} | {r['median_seconds']:.3f} | {', '.join(f'{s:.2f}' for s in r['runs'])} | "
                     f"{target} | {met} |")
    return "\n".join(lines)


def store_size(work: Path, uri: str) -> dict:
    out = {"artifact_bytes": sum(f.stat().st_size for name in ("mlartifacts", "mlruns") for f in (work / name).rglob("*") if f.is_file())}
    if uri.startswith("sqlite:///"):
        out["sqlite_bytes"] = Path(uri.removeprefix("sqlite:///")).stat().st_size
    elif uri.startswith("postgresql"):
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri)
        with engine.connect() as connection:
            out["postgresql_bytes"] = connection.execute(sqlalchemy.text("select pg_database_size(current_database())")).scalar()
        engine.dispose()
    return out


def measure_store(uri: str, work: Path, storage: Path, args, store: str) -> dict:
    built_record = work / f"built-{store}.json"
    if args.rebuild or not built_record.exists():
        if store == "postgresql":
            reset_postgres(uri)
        print(f"building the doc19 store in {uri} ...", flush=True)
        build_store(uri, storage, work, args)
    built = json.loads(built_record.read_text())
    print(f"built ({built['cells']} cells, {built['trials']} trials, {built['selectors']} selectors):", flush=True)
    for phase, seconds in built["phases"].items():
        print(f"  {phase}: {seconds:.1f}s")
    print(f"timing commands on {store} ...", flush=True)
    rows, notes = time_commands(uri, storage, work, args, store) if not args.ui_only else ([], {})
    ui_rows, ui_notes = time_ui(uri, work, args, store)
    return {"uri": uri, "build": built, "size": store_size(work, uri), "rows": rows + ui_rows, "notes": {**notes, **ui_notes}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of doc19's 765 cells written (0.1: a smoke run; 0.333: one seed's 255)")
    parser.add_argument("--trials", type=int, default=4, help="trial runs per cell (doc19: 4)")
    parser.add_argument("--epochs", type=int, default=5, help="per-epoch metric steps per trial run (doc19 trains 2)")
    parser.add_argument("--run-depth", type=int, default=100, help="documents per query in the logged TREC runs (doc19: 100)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per operation (the median is reported)")
    parser.add_argument("--workdir", help="where the store is built (reused when it exists; default: a new temporary directory)")
    parser.add_argument("--rebuild", action="store_true", help="build the store again even if the workdir has one")
    parser.add_argument("--profile", action="store_true", help="also run status and report once under cProfile")
    parser.add_argument("--no-browser", action="store_true", help="skip the headless Chromium timing of the run list")
    parser.add_argument("--postgres", metavar="URI", help="also build and time the store in this PostgreSQL database")
    parser.add_argument("--ui-only", action="store_true", help="time only the MLflow UI (the CLI commands not run)")
    parser.add_argument("--only-postgres", action="store_true", help="with --postgres: keep the SQLite results already in --out")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tracking_scale.json"))
    args = parser.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tracking-scale-")).resolve()
    if args.rebuild and work.exists() and args.workdir:
        for name in ("sqlite", "postgresql"):
            if (name == "sqlite" and not args.only_postgres) or (name == "postgresql" and args.postgres):
                shutil.rmtree(work / name, ignore_errors=True)
    os.environ.setdefault("ORCHESTRATE_CACHE_DIR", str(work / "cache"))  # the selectors' "trained" markers
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    print(f"workdir: {work}", flush=True)
    stores = {}
    sqlite_work = work / "sqlite"
    sqlite_work.mkdir(parents=True, exist_ok=True)
    if args.only_postgres and Path(args.out).exists():
        stores["sqlite"] = json.loads(Path(args.out).read_text())["stores"]["sqlite"]
    else:
        stores["sqlite"] = measure_store(f"sqlite:///{sqlite_work / 'mlflow.db'}", sqlite_work, sqlite_work / "sweeps", args, "sqlite")
    if args.postgres:
        pg_work = work / "postgresql"
        pg_work.mkdir(parents=True, exist_ok=True)
        os.chdir(pg_work)  # MLflow's default artifact root (./mlruns) for a database store: here, absolute in the runs
        stores["postgresql"] = measure_store(args.postgres, pg_work, pg_work / "sweeps", args, "postgresql")
        os.chdir(REPO)
    rows = [r for s in stores.values() for r in s["rows"]]
    print()
    print(table(rows))
    for name, s in stores.items():
        print(f"\n{name}: build {s['build']['phases']['total']:.0f}s; {json.dumps(s['size'])}")
        for key, value in s["notes"].items():
            if key != "profile":
                print(f"  {key}: {value}")
        for command, profile in s["notes"].get("profile", {}).items():
            print(f"  profile of {command} ({profile['wall_seconds']}s):")
            for label, value in profile.items():
                if isinstance(value, dict):
                    print(f"    {label}: {value['cumulative_seconds']}s in {value['calls']} calls")
    write_results(args.out, args, workdir=str(work), rows=rows, stores=stores)


if __name__ == "__main__":
    main()
