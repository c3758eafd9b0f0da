"""`orchestrate run` and a sweep go through one lifecycle: the same quantity has the same
metric name on both, and a cell run and its trial runs carry the same axis tags."""

import json

import pytest

from orchestrator.core.tracking import Tracker
from tests.helpers import by_kind, mlflow_runs, run_cli

pytestmark = pytest.mark.slow

# Quantities only one command has: the data preparation and the evaluation of `run` happen in
# the sweep's driver once for all cells; a cell counts its trials.
RUN_ONLY = {"time_prepare_seconds", "time_evaluation_seconds"}
SWEEP_ONLY = {"trials_complete"}
# a cell's statistics over its seeds and against its baseline (orchestrator.sweep.winners.log_cell_statistics): a sweep's alone
SWEEP_STATISTICS = ("_seed_mean", "_seed_std", "_seeds", "_difference", "_ci_low", "_ci_high")


def test_run_and_sweep_log_the_same_names(trial_run, failing_sweep):
    from mlflow.tracking import MlflowClient


    work, uri, report, _ = trial_run
    run_metrics = set(Tracker(uri).client.get_run(report["mlflow_run_id"]).data.metrics)
    stored = set(MlflowClient(tracking_uri=uri).get_run(report["mlflow_run_id"]).data.metrics)
    # the store groups a target's measures by slashes; the code reads them back under its own names
    assert {"test/ndcg_at_10", "test/cross_encoder/ndcg_at_10", "bm25/test/ndcg_at_10", "best/val/ndcg_at_10",
            "time_trial_seconds"} <= stored and "test_ndcg_at_10" not in stored
    assert {name.replace("/", "_") for name in stored} == run_metrics
    _, _, sweep_uri, *_ = failing_sweep
    client, runs = mlflow_runs(sweep_uri, "tiny-fail")
    # the baseline cell (pointwise, no augmentation, tuned interpolation) is the same kind of trial as the run's
    cell = next(r for r in by_kind(runs, "cell") if r.data.tags["loss"] == "pointwise" and r.info.status == "FINISHED")
    winner = client.get_run(cell.data.tags["rerank_lab.winner"])
    sweep_metrics = set(cell.data.metrics) | set(winner.data.metrics)
    assert {"test_ndcg_at_10_seed_mean", "test_ndcg_at_10_seeds"} <= set(cell.data.metrics)
    sweep_metrics = {name for name in sweep_metrics if not name.endswith(SWEEP_STATISTICS)}
    assert run_metrics - RUN_ONLY == sweep_metrics - SWEEP_ONLY
    expected = {"best_val_ndcg_at_10", "best_epoch", "val_ndcg_at_10", "val_cross_encoder_ndcg_at_10", "test_ndcg_at_10",
                "test_cross_encoder_ndcg_at_10", "bm25_test_ndcg_at_10", "bm25_val_ndcg_at_10", "test_interpolation_weight",
                "best_val_interpolation_weight", "time_train_wall_seconds", "time_training_seconds", "time_overhead_seconds",
                "time_trial_seconds", "time_train_seconds_per_epoch", "degenerate_batches", "train_loss",
                "time_startup_seconds", "time_setup_seconds", "time_checkpoint_seconds", "epoch_startup_seconds",
                "epoch_setup_seconds", "epoch_checkpoint_seconds"}
    assert expected <= run_metrics and expected <= sweep_metrics
    # and the same per-query artifacts
    run_artifacts = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(report["mlflow_run_id"], "per_query")}
    cell_artifacts = {a.path for a in client.list_artifacts(cell.info.run_id, "per_query")}
    assert run_artifacts == cell_artifacts == {"per_query/test.json", "per_query/test_cross_encoder.json", "per_query/bm25_test.json"}


def test_compare_a_cell_with_its_bm25_and_with_another_cell(failing_sweep):
    work, _, uri, *_ = failing_sweep
    _, runs = mlflow_runs(uri, "tiny-fail")
    cells = [r for r in by_kind(runs, "cell") if r.info.status == "FINISHED"]
    against_bm25 = run_cli(work, "compare", cells[0].info.run_id, "--tracking-uri", uri, "--json")
    assert against_bm25.returncode == 0, against_bm25.stderr[-2000:]
    result = json.loads(against_bm25.stdout)
    assert result["a"]["collection"] == "test" and result["b"]["collection"] == "bm25_test" and result["queries"] == 30
    assert all(0 <= m["p_value"] <= 1 for m in result["measures"])
    ndcg = next(m for m in result["measures"] if m["metric"] == "ndcg_at_10")
    assert ndcg["b"] == pytest.approx(cells[0].data.metrics["bm25_test_ndcg_at_10"], abs=1e-9)
    between = run_cli(work, "compare", cells[0].info.run_id, cells[1].info.run_id, "--tracking-uri", uri)
    assert between.returncode == 0 and "p:" in between.stdout and "nDCG@10" in between.stdout
