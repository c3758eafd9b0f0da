"""The trainable objective (encoder + loss): a loss's own parameters (RankingNCA's learned map)
are synchronised across data-parallel workers, exempt from weight decay and clipped."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workloads.batches import triples_to_batch
from workloads.losses import build_loss
from workloads.spec import LossSpec

ROWS = [
    {"query_id": "a", "query": "what purrs", "positive": "cats purr when happy", "negative": "dogs bark at night",
     "augmented_positive": "cats purr", "augmented_negative": "the stock market fell"},
    {"query_id": "b", "query": "why is the sky blue", "positive": "rayleigh scattering makes the sky blue",
     "negative": "grass is green", "augmented_positive": "the sky is blue", "augmented_negative": "pasta recipes"},
    {"query_id": "c", "query": "who wrote hamlet", "positive": "shakespeare wrote hamlet", "negative": "a danish prince",
     "augmented_positive": "hamlet by shakespeare", "augmented_negative": "ocean tides"},
    {"query_id": "d", "query": "boiling point of water", "positive": "water boils at 100 degrees", "negative": "ice is cold",
     "augmented_positive": "boils at 100", "augmented_negative": "football scores"},
]
NCA_LEARNED = LossSpec(contrastive="nca", nca_map="learned", lambda_=0.9)


def make_objective(model_dir):
    from workloads.models.cross_encoder import CrossEncoder
    from workloads.training import TrainingObjective

    model = CrossEncoder.from_pretrained(str(model_dir), max_length=32)
    return TrainingObjective(model, build_loss(NCA_LEARNED, model.encoder.config.hidden_size), None)


def optimizer_for(objective, weight_decay):
    from workloads.training import parameter_groups

    optimizer = torch.optim.AdamW(parameter_groups(objective, weight_decay), lr=1e-2)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), torch.amp.GradScaler("cuda", enabled=False)


def _ddp_worker(rank: int, world: int, model_dir: str, port: int, out_dir: str) -> None:
    from workloads.training import optimization_step

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)  # the workers' own randomness (dropout) differs, as in real training
    objective = make_objective(model_dir)
    wrapped = torch.nn.parallel.DistributedDataParallel(objective)
    optimizer, scheduler, scaler = optimizer_for(objective, 0.01)
    for step in range(3):
        rows = ROWS[:2] if (rank + step) % 2 == 0 else ROWS[2:]  # each worker sees other data
        batch = triples_to_batch(rows)
        pairs = objective.model.encode(batch.queries, batch.documents)
        optimization_step(wrapped, objective, optimizer, scheduler, scaler, pairs.inputs, batch.structure, 1.0)
    torch.save(objective.loss_fn.contrastive.map.weight.detach(), f"{out_dir}/map-{rank}.pt")
    dist.destroy_process_group()


def test_learned_nca_map_stays_identical_across_data_parallel_workers(tiny_model_dir, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, str(tiny_model_dir), port, str(tmp_path)), nprocs=2, join=True)
    first, second = torch.load(tmp_path / "map-0.pt"), torch.load(tmp_path / "map-1.pt")
    assert not torch.allclose(first, torch.eye(first.shape[0]))  # it learned
    assert torch.allclose(first, second, atol=1e-6)              # and every worker holds the same map


def test_learned_nca_map_is_not_decayed_and_is_clipped(tiny_model_dir):
    from workloads.training import optimization_step

    torch.manual_seed(0)
    objective = make_objective(tiny_model_dir)
    optimizer, scheduler, scaler = optimizer_for(objective, weight_decay=0.5)
    nca_map = objective.loss_fn.contrastive.map.weight
    # one relevant pair per query: nothing for NCA to contrast, so the map's gradient is 0 and only
    # weight decay could move it
    batch = triples_to_batch([{k: v for k, v in ROWS[0].items() if not k.startswith("augmented")}])
    pairs = objective.model.encode(batch.queries, batch.documents)
    optimization_step(objective, objective, optimizer, scheduler, scaler, pairs.inputs, batch.structure, 1.0)
    assert objective.loss_fn.contrastive.degenerate_batches == 1
    assert torch.equal(nca_map.detach(), torch.eye(nca_map.shape[0]))  # stays at its identity initialisation
    # clipping covers the map: after a step with a tiny max norm, its gradient norm is within it
    batch = triples_to_batch(ROWS)
    pairs = objective.model.encode(batch.queries, batch.documents)
    optimization_step(objective, objective, optimizer, scheduler, scaler, pairs.inputs, batch.structure, 1e-4)
    assert nca_map.grad is not None and nca_map.grad.norm() <= 1e-4 * (1 + 1e-3)
    total = torch.sqrt(sum(p.grad.norm() ** 2 for p in objective.parameters() if p.grad is not None))
    assert total == pytest.approx(1e-4, rel=1e-2)
