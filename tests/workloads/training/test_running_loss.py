"""The epoch's loss is summed on the device and read once per logging interval, and it is the
number the loop reported when it read every step's loss on the host (617b804): per micro-batch
``0 + loss / k`` in fp32, then ``total += float(step)`` in Python. An in-epoch checkpoint
carries the running sum, so a trial resumed inside an epoch reports the uninterrupted mean."""

import shutil

import pytest
import torch

from workloads.kinds.rerank.batching import triples_to_batch
from workloads.kinds.rerank.in_epoch_checkpoints import STATE_FILE
from workloads.kinds.rerank.spec import LossSpec, TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import RerankEpochs, train_cross_encoder
from workloads.losses import build_loss
from workloads.models.cross_encoder import CrossEncoder
from workloads.training.objective import TrainingObjective
from workloads.training.step import RunningLoss, accumulated_step, adamw

SPEC = {
    "name": "running-loss", "data": {"collection": "beir/scifact", "validation_queries": 5},
    "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
    "training_data": {"size": 32, "seed": 3},
    # 16 triples: 4 optimizer steps of 2 accumulated batches of 2 triples; an in-epoch save after step 2
    "optimization": {"epochs": 1, "batch_size": 4, "gradient_accumulation": 2, "learning_rate": 1e-3, "precision": "fp32",
                     "checkpoint_every": {"steps": 2}},
}


def test_the_running_sum_is_pythons_float_sum_bit_for_bit():
    """fp64 on the device, each fp32 loss widened exactly: Python's ``total += float(loss)``
    (an fp32 sum would differ, which the second assertion shows for these values)."""
    losses = torch.rand(997, generator=torch.Generator().manual_seed(0)) * 7
    running, total, fp32 = RunningLoss(torch.device("cpu")), 0.0, torch.zeros(())
    for loss in losses:
        running.add(loss)
        total += float(loss)
        fp32 += loss
    assert running.value() == total
    assert float(fp32) != total
    resumed = RunningLoss(torch.device("cpu"), float(losses[:500].double().cumsum(0)[-1]))
    assert resumed.value() == sum(float(loss) for loss in losses[:500])


def _old_epoch_loss(micro_losses: list[torch.Tensor], accumulation: int) -> float:
    """617b804's train_loss from the objective's losses: each step ``zeros(()) + loss.cpu() / k``
    per batch, read with ``float`` and summed in Python; the mean over steps."""
    total, steps = 0.0, len(micro_losses) // accumulation
    for step in range(steps):
        step_loss = torch.zeros(())
        for loss in micro_losses[step * accumulation:(step + 1) * accumulation]:
            step_loss = step_loss + loss.cpu() / accumulation
        total += float(step_loss)
    return total / steps


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, tiny_model_dir, scifact_dir):
    spec = TrialSpec.model_validate({**SPEC, "model": {"name": str(tiny_model_dir), "max_length": 64}})
    return spec, prepare_trial(spec).training


def _recording(monkeypatch, losses: list):
    """Every loss the objective returns, detached, in order (the old code's per-batch values)."""
    forward = TrainingObjective.forward

    def recorded_forward(self, inputs, structure):
        loss = forward(self, inputs, structure)
        losses.append(loss.detach().clone())
        return loss

    monkeypatch.setattr(TrainingObjective, "forward", recorded_forward)


def test_the_logged_train_loss_is_the_per_step_read_mean_and_survives_an_in_epoch_resume(tmp_path, monkeypatch, recorded):
    spec, training = recorded
    accumulation = spec.optimization.gradient_accumulation

    whole_losses: list = []
    _recording(monkeypatch, whole_losses)
    whole: list = []
    train_cross_encoder(spec, training, lambda metrics, checkpoint: whole.append(metrics), in_epoch_dir=tmp_path / "a")
    assert len(whole_losses) == 4 * accumulation
    assert whole[0]["train_loss"] == _old_epoch_loss(whole_losses, accumulation)

    # killed in step 3, after the in-epoch save of step 2: the state carries the sum of steps 1-2
    real_step, calls, dying = RerankEpochs._step, [], [True]

    def dying_step(self, micro, epoch, step, parts):
        calls.append(step)
        if step == 3 and dying[0]:
            raise RuntimeError("the node went away")
        return real_step(self, micro, epoch, step, parts)

    monkeypatch.setattr(RerankEpochs, "_step", dying_step)
    first: list = []
    with pytest.raises(RuntimeError, match="went away"):
        train_cross_encoder(spec, training, lambda metrics, checkpoint: first.append(metrics), in_epoch_dir=tmp_path / "b")
    saved = torch.load(tmp_path / "b" / STATE_FILE, weights_only=False)
    assert saved["step"] == 2 and first == []
    assert saved["total_loss"] == _old_epoch_loss(whole_losses[:2 * accumulation], accumulation) * 2

    calls.clear()
    dying[0] = False
    resumed: list = []
    train_cross_encoder(spec, training, lambda metrics, checkpoint: resumed.append(metrics), in_epoch_dir=tmp_path / "b")
    assert calls == [3, 4]  # resumed inside the epoch, after the saved step
    assert resumed[0]["train_loss"] == whole[0]["train_loss"]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_a_step_reads_nothing_and_returns_what_the_per_step_read_gave(tiny_model_dir):
    """A step of 2 accumulated batches with a combined loss: its loss and its parts stay tensors
    (no host read in the step), equal bit for bit to 617b804's ``zeros(()) + loss.cpu() / k`` and
    its parts' ``0.0 + float(part) / k``."""
    rows = [{"query_id": q, "query": f"query {q}", "positive": f"the answer to {q}", "negative": f"nothing about {q}"}
            for q in "abcd"]
    torch.manual_seed(0)
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=32)
    objective = TrainingObjective(model, build_loss(LossSpec(contrastive="scl", lambda_=0.3), 32), None)
    optimizer = adamw([{"params": list(objective.parameters())}], lr=1e-3)
    scheduler, scaler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), torch.amp.GradScaler("cuda", enabled=False)
    seen: list = []
    forward = objective.loss_fn.forward

    def recorded(outputs, structure):
        loss = forward(outputs, structure)
        seen.append((loss.detach().clone(), {k: v.clone() for k, v in objective.loss_fn.last_parts.items()}))
        return loss

    objective.loss_fn.forward = recorded
    micro = []
    for half in (rows[:2], rows[2:]):
        batch = triples_to_batch(half)
        micro.append((model.encode(batch.queries, batch.documents).inputs, batch.structure))
    parts: dict = {}
    loss = accumulated_step(objective, objective, optimizer, scheduler, scaler, micro, 1.0, parts=parts)

    old_total, old_parts = torch.zeros(()), {}
    for value, named in seen:
        old_total = old_total + value.cpu() / 2
        for name, part in named.items():
            old_parts[name] = old_parts.get(name, 0.0) + float(part) / 2
    assert len(seen) == 2 and sorted(parts) == ["contrastive", "ranking"]
    assert isinstance(loss, torch.Tensor) and all(isinstance(value, torch.Tensor) for value in parts.values())
    assert float(loss) == float(old_total)
    assert {name: float(value) for name, value in parts.items()} == old_parts
