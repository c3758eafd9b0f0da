"""A preempted trial resumes exactly: killed anywhere in epoch 2 (before that epoch's first
in-epoch save, with no in-epoch saves at all, or after one with accumulated batches), the
restarted attempt ends with the uninterrupted trial's weights, losses and validation nDCG@10,
bit for bit (CPU, fp32, dropout on). And a trial's identity keys its accumulation."""

import shutil

import pytest
import torch
from transformers import AutoConfig

from orchestrator.lifecycle.identity import trial_key
from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import RerankEpochs, train_cross_encoder
from workloads.models.cross_encoder import CrossEncoder
from workloads.training.loop import generator_state

SPEC = {
    "name": "exact", "data": {"collection": "beir/scifact", "validation_queries": 5},
    "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
    "training_data": {"size": 32, "seed": 3},
    # 16 triples: 4 optimizer steps an epoch, each of 2 accumulated batches of 2 triples; an in-epoch save after step 2
    "optimization": {"epochs": 2, "batch_size": 4, "gradient_accumulation": 2, "learning_rate": 1e-3, "precision": "fp32",
                     "checkpoint_every": {"steps": 2}},
}


def _reporter(root, reports):
    def keep(metrics, checkpoint):
        shutil.copytree(checkpoint, root / f"epoch-{int(metrics['epoch'])}")
        reports.append(metrics)
    return keep


def _weights(directory):
    model = CrossEncoder.from_pretrained(str(directory))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, scifact_dir):

    assert AutoConfig.from_pretrained(tiny_model_dir).hidden_dropout_prob > 0  # dropout draws from the generators
    spec = TrialSpec.model_validate({**SPEC, "model": {"name": str(tiny_model_dir), "max_length": 64}})
    training = prepare_trial(spec).training
    root = tmp_path_factory.mktemp("uninterrupted")
    whole: list = []
    train_cross_encoder(spec, training, _reporter(root, whole), in_epoch_dir=root / "in-epoch")
    return spec, training, whole, _weights(root / "epoch-2")


@pytest.mark.parametrize("killed_in_call, in_epoch_saves, resumes_at", [
    (5, True, (2, 1)),   # epoch 2, step 1: epoch 1's in-epoch state (step 2) is still there and must be ignored
    (6, False, (2, 1)),  # epoch 2, step 2, no in-epoch saves: only the epoch checkpoint
    (7, True, (2, 3)),   # epoch 2, step 3: after the save of step 2, i.e. 4 of the epoch's 8 batches
], ids=["epoch-2-before-its-first-save", "epoch-2-epoch-checkpoint-only", "epoch-2-after-a-save-accumulated"])
def test_a_trial_killed_in_epoch_2_resumes_bit_identically(tmp_path, monkeypatch, uninterrupted, killed_in_call,
                                                           in_epoch_saves, resumes_at):
    spec, training, whole, expected = uninterrupted
    real_step, calls = RerankEpochs._step, []

    def dying_step(self, micro, epoch, step, parts):
        calls.append((epoch, step))
        if len(calls) == killed_in_call:
            raise RuntimeError("the node went away")
        return real_step(self, micro, epoch, step, parts)

    monkeypatch.setattr(RerankEpochs, "_step", dying_step)
    first, in_epoch = [], (tmp_path / "in-epoch" if in_epoch_saves else None)
    with pytest.raises(RuntimeError, match="went away"):
        train_cross_encoder(spec, training, _reporter(tmp_path, first), in_epoch_dir=in_epoch)
    assert [m["epoch"] for m in first] == [1]
    if in_epoch is not None:  # what the restarted attempt finds beside the epoch checkpoint
        saved = torch.load(in_epoch / STATE_FILE, weights_only=False)
        assert (saved["epoch"], saved["step"]) == ((1, 2) if resumes_at == (2, 1) else (2, 2))
    calls.clear()
    monkeypatch.setattr(RerankEpochs, "_step", lambda self, *a: calls.append(a[1:3]) or real_step(self, *a))
    resumed: list = []
    train_cross_encoder(spec, training, _reporter(tmp_path, resumed), resume_from=tmp_path / "epoch-1",
                        in_epoch_dir=in_epoch)
    assert calls[0] == resumes_at and len(calls) == 4 - resumes_at[1] + 1
    assert [m["epoch"] for m in first + resumed] == [1, 2]
    for uninterrupted_epoch, again in zip(whole, first + resumed):
        assert again["train_loss"] == uninterrupted_epoch["train_loss"]
        assert again["val_ndcg_at_10"] == uninterrupted_epoch["val_ndcg_at_10"]
    got = _weights(tmp_path / "epoch-2")
    assert got.keys() == expected.keys()
    assert [k for k in expected if not torch.equal(expected[k], got[k])] == []


def test_the_epoch_checkpoint_carries_every_workers_generators(tmp_path, uninterrupted):
    """What makes the resume exact: the state of epoch 1 holds the generators epoch 2 starts
    from (one per worker); the last epoch's too (nothing reads it, it costs a few KB)."""
    spec, training, _, _ = uninterrupted
    one = spec.model_copy(update={"optimization": spec.optimization.model_copy(update={"epochs": 1})})
    reports: list = []
    train_cross_encoder(one, training, _reporter(tmp_path, reports))
    state = torch.load(tmp_path / "epoch-1" / STATE_FILE, weights_only=False)
    now = generator_state()  # nothing drew since the checkpoint was written
    assert len(state["generators"]) == 1
    assert torch.equal(state["generators"][0]["torch"], now["torch"]) and state["generators"][0]["python"] == now["python"]


def test_a_trials_identity_keys_its_gradient_accumulation():
    """An accumulated trial never reuses an unaccumulated trial's result (nor one of another
    accumulation); accumulation 1 keeps the key trials had before accumulation existed."""
    base = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}
    keys = {k: trial_key(TrialSpec.model_validate({**base, "optimization": {"gradient_accumulation": k}})) for k in (1, 2, 4)}
    assert keys[1] == trial_key(TrialSpec.model_validate(base)) == "761b677795444a3d"  # the key before accumulated steps
    assert len(set(keys.values())) == 3
