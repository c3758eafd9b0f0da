"""The data plane runs a whole trial without Ray or MLflow: prepare, train, choose, test."""

import pytest

from workloads.spec import TrialSpec
from workloads.trial import choose_epoch, run_trial_in_process


def test_choose_epoch_is_the_best_validation_and_the_earlier_on_ties():
    epochs = [{"val_ndcg_at_10": 0.3}, {"val_ndcg_at_10": 0.5}, {"val_ndcg_at_10": 0.5}, {"val_ndcg_at_10": 0.4}]
    assert choose_epoch(epochs) == 1
    with pytest.raises(ValueError, match="no epoch"):
        choose_epoch([])


def test_a_tiny_trial_in_process(tmp_path, tiny_model_dir, scifact_dir):
    spec = TrialSpec.model_validate({
        "name": "in-process", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 16, "seed": 3}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "optimization": {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3},
    })
    prepared, records, tested = run_trial_in_process(spec, tmp_path / "checkpoints")
    assert [r.metrics["epoch"] for r in records] == [1, 2]
    chosen = records[choose_epoch([r.metrics for r in records])]
    assert all(chosen.metrics["val_ndcg_at_10"] >= r.metrics["val_ndcg_at_10"] for r in records)
    assert (tmp_path / "checkpoints" / "epoch-1").is_dir() and (tmp_path / "checkpoints" / "epoch-2").is_dir()
    assert tested.evaluation.num_queries == 300 and 0 <= tested.evaluation.aggregate["ndcg_at_10"] <= 1
    assert prepared.data_stats["train_queries"] > 0
