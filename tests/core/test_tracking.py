"""The names MLflow stores metrics under, and stores written before they were grouped."""

from __future__ import annotations

import pytest

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from workloads.evaluation import MEASURES


@pytest.mark.parametrize(("name", "stored"), [
    ("test_ndcg_at_10", "test/ndcg_at_10"),
    ("test_cross_encoder_ndcg_at_10", "test/cross_encoder/ndcg_at_10"),
    ("bm25_test_ndcg_at_10", "bm25/test/ndcg_at_10"),
    ("bm25_val_p_at_1", "bm25/val/p_at_1"),
    ("best_val_ndcg_at_10", "best/val/ndcg_at_10"),
    ("best_val_interpolation_weight", "best/val/interpolation_weight"),
    ("val_cross_encoder_rr_at_10", "val/cross_encoder/rr_at_10"),
    ("zs_nfcorpus_test_map_at_20", "zs_nfcorpus_test/map_at_20"),
    ("bm25_robust_typo_ap", "bm25/robust_typo/ap"),
    ("robust_typo_cross_encoder_ndcg_at_10", "robust_typo/cross_encoder/ndcg_at_10"),
    ("time_trial_seconds", "time_trial_seconds"),  # not a target's measure: as it is
    ("train_loss", "train_loss"),
    ("ndcg_at_10", "ndcg_at_10"),
])
def test_a_targets_measures_are_grouped_by_slashes(name, stored):
    assert schema.stored_metric_name(name) == stored
    assert schema.code_metric_name(stored) == name


def test_every_name_the_project_logs_reads_back_as_itself():
    targets = [schema.TEST, "val", schema.zero_shot_target("beir/nfcorpus", "test"), schema.perturbed_target("typo")]
    prefixes = [p for t in targets for p in (schema.target_prefix(t), schema.cross_encoder_prefix(t), schema.first_stage_prefix(t))]
    prefixes += [schema.BEST_PREFIX + schema.VALIDATION_PREFIX, schema.VALIDATION_CROSS_ENCODER_PREFIX]
    names = [f"{p}{m}" for p in prefixes for m in MEASURES] + [schema.weight_metric(t) for t in targets]
    names += [schema.BEST_OBJECTIVE, schema.BEST_EPOCH, schema.TUNED_WEIGHT, schema.TIME_TRIAL, schema.TRIALS_COMPLETE]
    names = list(dict.fromkeys(names))
    stored = [schema.stored_metric_name(n) for n in names]
    assert [schema.code_metric_name(s) for s in stored] == names
    assert len(set(stored)) == len(names)
    assert all("/" in s for n, s in zip(names, stored) if any(n.endswith(m) for m in MEASURES))


def test_a_store_written_with_flat_names_reads_the_same_and_new_writes_are_grouped(tmp_path):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient


    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw = MlflowClient(tracking_uri=uri)
    experiment = raw.create_experiment("older")
    older = raw.create_run(experiment).info.run_id  # as stores were written before names were grouped
    raw.log_batch(older, metrics=[Metric("test_ndcg_at_10", 0.5, 0, 0), Metric("val_ndcg_at_10", 0.25, 0, 1),
                                  Metric("val_ndcg_at_10", 0.375, 0, 2)])
    tracker = Tracker(uri)
    newer = tracker.client.create_run(experiment).info.run_id
    tracker.log_metrics(newer, {"test_ndcg_at_10": 0.75, "time_trial_seconds": 3.0})
    tracker.log_metrics(newer, {"val_ndcg_at_10": 0.125}, step=1)

    assert set(raw.get_run(newer).data.metrics) == {"test/ndcg_at_10", "val/ndcg_at_10", "time_trial_seconds"}
    assert tracker.run_metrics(older) == {"test_ndcg_at_10": 0.5, "val_ndcg_at_10": 0.375}
    assert tracker.run_metrics(newer) == {"test_ndcg_at_10": 0.75, "val_ndcg_at_10": 0.125, "time_trial_seconds": 3.0}
    found = {r.info.run_id: r.data.metrics["test_ndcg_at_10"] for r in tracker.client.search_runs([experiment])}
    assert found == {older: 0.5, newer: 0.75}
    assert [(m.key, m.step, m.value) for m in tracker.client.get_metric_history(older, "val_ndcg_at_10")] == [
        ("val_ndcg_at_10", 1, 0.25), ("val_ndcg_at_10", 2, 0.375)]
    assert [(m.key, m.step) for m in tracker.client.get_metric_history(newer, "val_ndcg_at_10")] == [("val_ndcg_at_10", 1)]
    # the older run written again since (a cell tested again, a trial resumed): the grouped value is the newer one
    tracker.log_metrics(older, {"test_ndcg_at_10": 0.625})
    tracker.log_metrics(older, {"val_ndcg_at_10": 0.5}, step=3)
    assert tracker.run_metrics(older)["test_ndcg_at_10"] == 0.625
    assert [m.step for m in tracker.client.get_metric_history(older, "val_ndcg_at_10")] == [1, 2, 3]


KILLED_MID_TRANSACTION = """
import os, signal, sqlite3, sys
connection = sqlite3.connect(sys.argv[1])
connection.execute("create table t(a)")
connection.execute("insert into t values ('kept')")
connection.commit()
connection.execute("pragma cache_size=1")  # the transaction's pages go to the file, the old ones to the journal
connection.execute("begin")
connection.executemany("insert into t values (?)", [(os.urandom(200),) for _ in range(5000)])
os.kill(os.getpid(), signal.SIGKILL)  # a driver killed while it writes: a hot journal stays
"""


def test_a_database_a_killed_writer_left_with_a_hot_journal_is_accepted_and_rolled_back_on_open(tmp_path):
    """After a driver's SIGKILL the rerun must open its stores: a read-only check cannot roll a
    hot journal back ("attempt to write a readonly database"), which is no sign of a damaged file."""
    import sqlite3  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from orchestrator.core.tracking import check_sqlite_file  # noqa: PLC0415

    path = tmp_path / "optuna.db"
    subprocess.run([sys.executable, "-c", KILLED_MID_TRANSACTION, str(path)], check=False)
    assert (tmp_path / "optuna.db-journal").stat().st_size > 0
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # what the check met
        sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("select count(*) from sqlite_master").fetchone()
    check_sqlite_file(path, "Optuna storage")  # no InputError
    assert (tmp_path / "optuna.db-journal").stat().st_size > 0  # the check wrote nothing
    assert sqlite3.connect(path).execute("select a from t").fetchall() == [("kept",)]  # SQLite's rollback on open
