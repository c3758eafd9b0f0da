"""The data plane runs a whole trial without Ray or MLflow: prepare, train, choose, test."""

import shutil

import pytest
import torch
from transformers import AutoConfig, AutoModel

from tests.helpers import assert_validates_query_by_query
from workloads.kinds import choose_epoch
from workloads.kinds import run_in_process as run_trial_in_process
from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE, InEpochCheckpoints
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import RerankEpochs, train_cross_encoder
from workloads.models.cross_encoder import CrossEncoder
from workloads.training import seed_everything


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
    for record in records:
        assert_validates_query_by_query(record.metrics, queries=5)
    chosen = records[choose_epoch([r.metrics for r in records])]
    assert all(chosen.metrics["val_ndcg_at_10"] >= r.metrics["val_ndcg_at_10"] for r in records)
    assert (tmp_path / "checkpoints" / "epoch-1").is_dir() and (tmp_path / "checkpoints" / "epoch-2").is_dir()
    assert tested.evaluation.num_queries == 300 and 0 <= tested.evaluation.aggregate["ndcg_at_10"] <= 1
    assert prepared.data_stats["train_queries"] > 0


def test_early_stopping_ends_a_trial_without_progress_and_a_resume_trains_no_more(tmp_path, tiny_model_dir, scifact_dir):
    spec = TrialSpec.model_validate({
        "name": "early", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 16, "seed": 3}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        # a learning rate too small to change any ranking: validation never improves after epoch 1
        "optimization": {"epochs": 6, "batch_size": 8, "learning_rate": 1e-12, "early_stopping_patience": 2},
    })
    prepared = prepare_trial(spec)
    reports, reported = [], []

    def keep(metrics, checkpoint):
        shutil.copytree(checkpoint, tmp_path / f"epoch-{int(metrics['epoch'])}")
        reports.append(metrics)
        reported.append(checkpoint)

    train_cross_encoder(spec, prepared.training, keep)
    assert [m["epoch"] for m in reports] == [1, 2, 3]  # epochs 2 and 3 without a better value: stop
    # each epoch's temporary directory is removed once reported (a reporter copies what it keeps)
    assert len(reported) == 3 and not any(path.exists() for path in reported)
    assert len({m["val_ndcg_at_10"] for m in reports}) == 1 and choose_epoch(reports) == 0
    train_cross_encoder(spec, prepared.training, keep, resume_from=tmp_path / "epoch-3")
    assert len(reports) == 3  # the stopped trial is done: a restarted worker trains nothing more
    without = spec.model_copy(update={"optimization": spec.optimization.model_copy(
        update={"early_stopping_patience": None, "epochs": 4})})
    reports.clear()
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    train_cross_encoder(without, prepared.training, keep)
    assert [m["epoch"] for m in reports] == [1, 2, 3, 4]


def test_a_requested_stop_ends_training_after_the_current_step(tmp_path, tiny_model_dir, scifact_dir):
    """What a sweep's pruner relies on: the loop returns by itself (workers released), after
    the step during which the stop file appeared, without reporting the unfinished epoch."""
    spec = TrialSpec.model_validate({
        "name": "stop", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 32, "seed": 3}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "optimization": {"epochs": 3, "batch_size": 8},
    })
    prepared = prepare_trial(spec)
    reports, asked = [], []
    marker = tmp_path / "pruned"

    def keep(metrics, checkpoint):
        reports.append(metrics)
        marker.touch()  # the driver decides right after epoch 1's result

    def stop_requested():
        asked.append(len(reports))
        return marker.exists()

    train_cross_encoder(spec, prepared.training, keep, stop_requested=stop_requested)
    assert [m["epoch"] for m in reports] == [1]
    assert asked == [0, 0, 0, 0, 1]  # every step of epoch 1 (4 steps of 8 pairs), then the first of epoch 2


def test_gradient_accumulation_in_the_loop_counts_optimizer_steps(tmp_path, tiny_model_dir, scifact_dir):
    """Batches of 4 pairs accumulated 2 at a time train like batches of 8: the same optimizer steps
    (and schedule), the same per-step losses (a mean loss, no dropout) and nearly the same weights."""

    model_dir = tmp_path / "no-dropout"
    config = AutoConfig.from_pretrained(tiny_model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    AutoModel.from_pretrained(tiny_model_dir, config=config).save_pretrained(model_dir)
    CrossEncoder.from_pretrained(str(tiny_model_dir)).tokenizer.save_pretrained(model_dir)
    runs = {}
    for batch_size, accumulation in ((8, 1), (4, 2)):
        spec = TrialSpec.model_validate({
            "name": f"acc{accumulation}", "data": {"collection": "beir/scifact", "validation_queries": 5},
            "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
            "training_data": {"size": 32, "seed": 3}, "model": {"name": str(model_dir), "max_length": 64},
            # fp32: equal up to float rounding; bf16 (what `auto` picks on a CPU that has it) is not that close
            "optimization": {"epochs": 2, "batch_size": batch_size, "gradient_accumulation": accumulation,
                             "learning_rate": 1e-3, "warmup_ratio": 0.5, "precision": "fp32"},
        })
        reports = []

        def keep(metrics, checkpoint, name=spec.name, reports=reports):
            shutil.copytree(checkpoint, tmp_path / name / f"epoch-{int(metrics['epoch'])}")
            reports.append(metrics)

        train_cross_encoder(spec, prepare_trial(spec).training, keep)
        state = torch.load(tmp_path / spec.name / "epoch-1" / STATE_FILE, weights_only=False)
        weights = CrossEncoder.from_pretrained(str(tmp_path / spec.name / "epoch-2")).score_head.weight.detach()
        runs[accumulation] = (reports, state["scheduler"]["last_epoch"], weights)
    (whole, whole_steps, whole_weights), (accumulated, steps, weights) = runs[1], runs[2]
    assert whole_steps == steps == 4  # 16 triples: 4 steps of 4 triples, or of 2 x 2 accumulated
    for a, b in zip(whole, accumulated):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)

    seed_everything(13)  # as the loop does before it builds the model: the head's initial weights
    start = CrossEncoder.from_pretrained(str(model_dir)).score_head.weight.detach()
    assert (whole_weights - start).norm() > 1e-4  # it trained
    assert (weights - whole_weights).norm() <= 1e-3 * (whole_weights - start).norm()


def _weights(directory):
    model = CrossEncoder.from_pretrained(str(directory))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("killed_in_call", [3, 7], ids=["epoch-1-step-3", "epoch-2-step-3"])
def test_a_trial_killed_inside_an_epoch_resumes_at_the_next_batch_with_identical_weights(
        tmp_path, tiny_model_dir, scifact_dir, monkeypatch, killed_in_call):
    """A preempted node: the attempt dies during a step; the restarted one is given the last
    epoch checkpoint (as Ray Train does) and the in-epoch directory, continues after the saved
    step and ends with exactly the uninterrupted trial's weights and losses (CPU, fp32)."""

    spec = TrialSpec.model_validate({
        "name": "preempted", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 32, "seed": 3}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "optimization": {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3, "precision": "fp32",
                         "checkpoint_every": {"steps": 2}},
    })
    training = prepare_trial(spec).training

    def reporter(root, reports):
        def keep(metrics, checkpoint):
            shutil.copytree(checkpoint, root / f"epoch-{int(metrics['epoch'])}")
            reports.append(metrics)
        return keep

    whole = []
    train_cross_encoder(spec, training, reporter(tmp_path / "whole", whole), in_epoch_dir=tmp_path / "whole-in-epoch")
    assert not (tmp_path / "whole-in-epoch").exists()  # cleared once every epoch is reported

    real_step, calls = RerankEpochs._step, []

    def dying_step(self, micro, epoch, step, parts):
        calls.append((epoch, step))
        if len(calls) == killed_in_call:
            raise RuntimeError("the node went away")
        return real_step(self, micro, epoch, step, parts)

    monkeypatch.setattr(RerankEpochs, "_step", dying_step)
    first, in_epoch = [], tmp_path / "in-epoch"
    with pytest.raises(RuntimeError, match="went away"):
        train_cross_encoder(spec, training, reporter(tmp_path / "a", first), in_epoch_dir=in_epoch)
    state = torch.load(in_epoch / "training_state.pt", weights_only=False)
    killed_epoch = calls[-1][0]
    assert (state["epoch"], state["step"]) == (killed_epoch, 2)  # saved after step 2; step 3 was in flight

    # saved by 1 worker taking 4 steps an epoch: another split of the batches cannot go on from it
    assert InEpochCheckpoints(in_epoch, 2, None).load(killed_epoch, steps_per_rank=2) is None
    assert InEpochCheckpoints(in_epoch, 2, None).load(killed_epoch, steps_per_rank=4) is not None
    monkeypatch.setattr(RerankEpochs, "_step", real_step)
    calls.clear()
    monkeypatch.setattr(RerankEpochs, "_step", lambda self, *a: calls.append(a[1:3]) or real_step(self, *a))
    resumed = []
    last_epoch = tmp_path / "a" / f"epoch-{killed_epoch - 1}"
    train_cross_encoder(spec, training, reporter(tmp_path / "a", resumed),
                        resume_from=last_epoch if killed_epoch > 1 else None, in_epoch_dir=in_epoch)
    assert calls[0] == (killed_epoch, 3)  # the next batch, not the epoch's first
    assert [m["epoch"] for m in first + resumed] == [1, 2]
    for uninterrupted, again in zip(whole, first + resumed):
        assert again["train_loss"] == uninterrupted["train_loss"]
        assert again["val_ndcg_at_10"] == uninterrupted["val_ndcg_at_10"]
    expected, got = _weights(tmp_path / "whole" / "epoch-2"), _weights(tmp_path / "a" / "epoch-2")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert not in_epoch.exists()


def test_in_epoch_checkpoints_by_minutes_are_decided_by_the_clock_and_never_after_the_last_step(tmp_path):
    by_time = InEpochCheckpoints(tmp_path, None, 1.0)
    assert not by_time.due(1, 10, 0, 1)
    by_time.last_saved -= 61
    assert by_time.due(2, 10, 0, 1) and not by_time.due(10, 10, 0, 1)
    by_steps = InEpochCheckpoints(tmp_path, 3, None)
    assert [s for s in range(1, 11) if by_steps.due(s, 10, 0, 1)] == [3, 6, 9]
    with pytest.raises(ValueError, match="one of steps or minutes"):
        TrialSpec.model_validate({"name": "x", "data": {"collection": "beir/scifact"}, "training_data": {"size": 8},
                                  "model": {"name": "m"}, "optimization": {"checkpoint_every": {"steps": 2, "minutes": 1}}})
