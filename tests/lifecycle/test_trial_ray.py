"""`orchestrate run` end to end on real SciFact data with a tiny random BERT:
prepare -> Ray Train (2 data-parallel workers) -> best epoch -> test -> MLflow."""

import json
from pathlib import Path

import pytest

from orchestrator.core.tracking import Tracker
from workloads.evaluation.reranking import WEIGHT_GRID

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

REPO = Path(__file__).resolve().parents[2]


def test_reports_validation_and_test_next_to_bm25(trial_run):
    _, _, report, _ = trial_run
    assert report["test"]["bm25"]["ndcg_at_10"] == pytest.approx(0.6789, abs=0.002)
    assert 0.0 <= report["test"]["model"]["ndcg_at_10"] <= 1.0
    assert set(report["validation"]["model"]) >= {"ndcg_at_10", "rr_at_10", "ap", "p_at_1"}
    assert report["best_epoch"] in (1, 2) and report["timings"]["train_seconds_per_epoch"] > 0
    # interpolated with BM25: the cross-encoder alone is reported beside the final ranking
    assert report["interpolation_weight"] in WEIGHT_GRID
    assert set(report["test"]["cross_encoder"]) == set(report["test"]["model"]) >= {"ndcg_at_10", "ap"}
    assert set(report["validation"]["cross_encoder"]) == set(report["validation"]["model"])


def test_test_ranking_uses_the_weight_tuned_on_validation_at_the_best_epoch(trial_run):
    _, uri, report, _ = trial_run
    client = Tracker(uri).client
    run_id = report["mlflow_run_id"]
    history = {name: {m.step: m.value for m in client.get_metric_history(run_id, name)}
               for name in ("val_ndcg_at_10", "val_cross_encoder_ndcg_at_10", "val_interpolation_weight")}
    assert sorted(history["val_interpolation_weight"]) == [1, 2]
    for epoch in (1, 2):  # w = 1 (the cross-encoder alone) is on the grid: tuning can only help validation
        assert history["val_ndcg_at_10"][epoch] >= history["val_cross_encoder_ndcg_at_10"][epoch] - 1e-12
    metrics = client.get_run(run_id).data.metrics
    assert metrics["test_interpolation_weight"] == history["val_interpolation_weight"][report["best_epoch"]]
    assert metrics["best_val_interpolation_weight"] == metrics["test_interpolation_weight"]
    local = Path(client.download_artifacts(run_id, "per_query/test_cross_encoder.json"))
    values = json.loads(local.read_text())["per_query"]["ndcg_at_10"]
    assert sum(values.values()) / 300 == pytest.approx(metrics["test_cross_encoder_ndcg_at_10"], abs=1e-9)


def test_mlflow_run_holds_config_axes_epochs_metrics_and_artifacts(trial_run):
    _, uri, report, _ = trial_run
    client = Tracker(uri).client
    experiment = client.get_experiment_by_name("tiny-scifact")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == report["mlflow_run_id"] and run.info.status == "FINISHED"
    assert run.data.params["loss.ranking"] == "pointwise" and run.data.params["training_data.size"] == "64"
    assert run.data.tags["size"] == "64" and run.data.tags["loss"] == "pointwise"
    history = client.get_metric_history(run.info.run_id, "val_ndcg_at_10")
    assert sorted(m.step for m in history) == [1, 2]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "data_stats.json", "per_query", "runs"} <= artifacts
    local = Path(client.download_artifacts(run.info.run_id, "per_query/test.json"))
    per_query = json.loads(local.read_text())
    assert per_query["num_queries"] == 300
    values = per_query["per_query"]["ndcg_at_10"]
    # the aggregate is the mean of the per-query values that are stored with the run
    assert sum(values.values()) / 300 == pytest.approx(run.data.metrics["test_ndcg_at_10"], abs=1e-9)
    reranked = Path(client.download_artifacts(run.info.run_id, "runs/test.reranked.trec")).read_text().splitlines()
    assert len({line.split()[0] for line in reranked}) == 300


def test_checkpoints_per_epoch_in_safetensors(trial_run):
    work, _, _, _ = trial_run
    checkpoints = sorted(p.parent.name for p in (work / "ray").rglob("score_head.safetensors"))
    assert checkpoints == ["epoch-1", "epoch-2"]
    assert all(any(p.glob("model.safetensors")) for p in (work / "ray").rglob("epoch-*"))


def test_rerun_reuses_the_finished_run(trial_run):
    _, uri, first, second = trial_run
    assert second["reused"] is True and second["mlflow_run_id"] == first["mlflow_run_id"]
    assert second["test"]["model"] == first["test"]["model"]
    experiment = Tracker(uri).client.get_experiment_by_name("tiny-scifact")
    assert len(Tracker(uri).client.search_runs([experiment.experiment_id])) == 1


def test_worker_progress_reaches_the_driver_once(trial_run):
    work, _, _, _ = trial_run
    lines = [line for line in (work / "first.stderr").read_text().splitlines() if "[train] epoch 1/2 [" in line]
    assert lines and len(lines) == len(set(lines))  # Train V2's print patch would print each line twice


def test_the_default_level_prints_the_projects_lines_and_ray_s_own_go_to_run_log(trial_run):
    # Ray forwards every worker line to the driver: Ray Train's own ("Reporting training result 1:
    # TrainingReport(...)" with every metric) filled the terminal of `run` beside the project's
    work, _, _, _ = trial_run
    stderr = (work / "first.stderr").read_text()
    assert "TrainingReport(" not in stderr and "Reporting training result" not in stderr, stderr[-3000:]
    assert "pid=" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    # the project's own, a Train worker's and a Ray task's included, without Ray's prefix
    assert any(line.startswith("[train] epoch 1/2 [") for line in lines), stderr[-3000:]
    assert any(line.startswith("[score] test: ") for line in lines), stderr[-3000:]
    assert f"[run] Ray's and Ray Train's own output goes to {work / 'ray' / 'run.log'} (-v shows it here)" in lines
    ray_log = (work / "ray" / "run.log").read_text()
    assert "Reporting training result 2: TrainingReport(" in ray_log and "[train] epoch" not in ray_log
