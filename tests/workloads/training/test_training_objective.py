"""The trainable objective (encoder + loss): a loss's own parameters (RankingNCA's learned map)
are synchronised across data-parallel workers, exempt from weight decay and clipped; the
fused optimizer makes the multi-tensor one's update."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from transformers import AutoConfig, AutoModel

from workloads.kinds.rerank.batching import lists_to_batch, triples_to_batch
from workloads.kinds.rerank.curriculum import CurriculumObjective
from workloads.kinds.rerank.spec import LossSpec, SIRSpec
from workloads.kinds.rerank.train import parameter_groups
from workloads.losses import build_loss
from workloads.models.cross_encoder import CrossEncoder
from workloads.training import TrainingObjective, accumulated_step, adamw, optimization_step

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
    model = CrossEncoder.from_pretrained(str(model_dir), max_length=32)
    return TrainingObjective(model, build_loss(NCA_LEARNED, model.encoder.config.hidden_size), None)


def optimizer_for(objective, weight_decay):
    optimizer = adamw(parameter_groups(objective, weight_decay), lr=1e-2)  # the training loop's optimizer
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), torch.amp.GradScaler("cuda", enabled=False)


def _ddp_worker(rank: int, world: int, model_dir: str, port: int, out_dir: str, micro_batch_size=None) -> None:
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
        optimization_step(wrapped, objective, optimizer, scheduler, scaler, pairs.inputs, batch.structure, 1.0,
                          micro_batch_size)
    torch.save(objective.loss_fn.contrastive.map.weight.detach(), f"{out_dir}/map-{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("micro_batch_size", [None, 3])
def test_learned_nca_map_stays_identical_across_data_parallel_workers(tiny_model_dir, tmp_path, micro_batch_size):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # micro-batched steps run outside DDP's forward and average the gradients themselves
    mp.spawn(_ddp_worker, args=(2, str(tiny_model_dir), port, str(tmp_path), micro_batch_size), nprocs=2, join=True)
    first, second = torch.load(tmp_path / "map-0.pt"), torch.load(tmp_path / "map-1.pt")
    assert not torch.allclose(first, torch.eye(first.shape[0]))  # it learned
    assert torch.allclose(first, second, atol=1e-6)              # and every worker holds the same map


def test_learned_nca_map_is_not_decayed_and_is_clipped(tiny_model_dir):
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


def _step_gradients(objective, inputs, structure, micro_batch_size, seed=0):
    """Every parameter's gradient after one step's backward (lr 0: the weights stay)."""
    optimizer = torch.optim.SGD(objective.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    torch.manual_seed(seed)
    loss = optimization_step(objective, objective, optimizer, scheduler, torch.amp.GradScaler("cuda", enabled=False),
                             inputs, structure, 1e9, micro_batch_size)
    return float(loss), {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}


def _assert_same(a, b):
    assert a[0] == pytest.approx(b[0], rel=1e-5)
    assert a[1].keys() == b[1].keys() and len(a[1]) > 10
    scale = torch.sqrt(sum(g.norm() ** 2 for g in b[1].values()))
    for name in a[1]:  # equal up to summation order
        assert (a[1][name] - b[1][name]).norm() <= 1e-4 * b[1][name].norm() + 1e-6 * scale, name


def test_a_micro_batched_step_has_the_whole_steps_gradient(tiny_model_dir):
    # the NCA loss reads phi and scores of every pair at once: the gradient reaches both
    objective = make_objective(tiny_model_dir)
    batch = triples_to_batch(ROWS)  # 16 pairs (augmented)
    pairs = objective.model.encode(batch.queries, batch.documents)
    objective.eval()  # no dropout: micro-batches of any size must give the whole step's gradient
    whole = _step_gradients(objective, pairs.inputs, batch.structure, None)
    for size in (1, 5, 16):
        _assert_same(_step_gradients(objective, pairs.inputs, batch.structure, size), whole)
    # with dropout, the second pass replays each micro-batch's masks: one micro-batch of the
    # whole step draws what the plain step draws, so the gradients agree exactly too
    objective.train()
    _assert_same(_step_gradients(objective, pairs.inputs, batch.structure, 16, seed=3),
                 _step_gradients(objective, pairs.inputs, batch.structure, None, seed=3))
    assert not torch.allclose(_step_gradients(objective, pairs.inputs, batch.structure, None, seed=4)[1]["model.score_head.weight"],
                              _step_gradients(objective, pairs.inputs, batch.structure, None, seed=3)[1]["model.score_head.weight"])


def test_a_micro_batched_sir_step_has_the_whole_steps_gradient(tiny_model_dir):
    """SIR v4 scores every level in its own forward: each is replayed."""
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=32)
    objective = CurriculumObjective(model, build_loss(LossSpec(ranking="sir"), 32), None,
                                    SIRSpec(variant="v4", levels=[4, 2]), "sir")
    texts = ["cats purr", "dogs bark", "the sky is blue", "hamlet", "water boils", "ice", "grass", "tides"]
    rows = [{"query_id": q, "query": q, "positive": texts[i], "negative_id": "x", "negative": "x",
             "negative_ids": [str(j) for j in range(7)], "negatives": [t for t in texts if t != texts[i]][:7]}
            for i, q in enumerate(["what purrs", "what barks"])]
    batch = lists_to_batch(rows)
    pairs = model.encode(batch.queries, batch.documents)
    objective.eval()
    whole = _step_gradients(objective, pairs.inputs, batch.structure, None)
    _assert_same(_step_gradients(objective, pairs.inputs, batch.structure, 3), whole)


def test_fused_adamw_is_the_same_update(tiny_model_dir):
    """The loops' optimizer is fused on CPU and steps the parameters, both groups (decayed or
    not), exactly as torch's multi-tensor AdamW does, to float rounding; where a parameter's
    device has no fused kernel it falls back to torch's default."""
    torch.manual_seed(0)
    objectives = [make_objective(tiny_model_dir) for _ in range(2)]
    objectives[1].load_state_dict(objectives[0].state_dict())
    fused = adamw(parameter_groups(objectives[0], 0.01), lr=1e-2)
    multi_tensor = torch.optim.AdamW(parameter_groups(objectives[1], 0.01), lr=1e-2, foreach=True)
    assert fused.defaults["fused"] is True and multi_tensor.defaults["fused"] is None
    start = [p.detach().clone() for p in objectives[0].parameters()]
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=generator) for p in objectives[0].parameters()]
        for objective, optimizer in zip(objectives, (fused, multi_tensor)):
            for p, g in zip(objective.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b, before in zip(objectives[0].parameters(), objectives[1].parameters(), start):
        assert not torch.equal(a, before)  # it stepped
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))
    assert adamw([{"params": [meta]}], lr=1e-2).defaults["fused"] is None


def _no_dropout_objective(model_dir, tmp_path):
    """A copy of the tiny model with dropout off, as a pointwise objective (BCE: a mean over pairs)."""

    path = tmp_path / "no-dropout"
    if not path.exists():
        config = AutoConfig.from_pretrained(model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        AutoModel.from_pretrained(model_dir, config=config).save_pretrained(path)
        CrossEncoder.from_pretrained(str(model_dir)).tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    model = CrossEncoder.from_pretrained(str(path), max_length=32)
    return TrainingObjective(model, build_loss(LossSpec(), model.encoder.config.hidden_size), None), path


def test_k_accumulated_batches_make_the_update_of_one_batch_k_times_as_large(tiny_model_dir, tmp_path):
    plain = [{k: v for k, v in row.items() if not k.startswith("augmented")} for row in ROWS]
    updated = []
    for micro in ([plain], [plain[:2], plain[2:]], [plain[:1], plain[1:2], plain[2:3], plain[3:]]):
        objective, _ = _no_dropout_objective(tiny_model_dir, tmp_path)
        # SGD: the update is lr x the (clipped) gradient, so equal updates mean equal gradients (Adam's first
        # step divides each gradient by its own magnitude and would blow float noise of ~0 gradients up)
        optimizer = torch.optim.SGD(objective.parameters(), lr=0.1)
        scheduler, scaler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), torch.amp.GradScaler("cuda", enabled=False)
        steps = []
        for rows in micro:
            batch = triples_to_batch(rows)
            steps.append((objective.model.encode(batch.queries, batch.documents).inputs, batch.structure))
        loss = accumulated_step(objective, objective, optimizer, scheduler, scaler, steps, 1.0)
        updated.append((float(loss), [p.detach().clone() for p in objective.parameters()]))
    start = [p.detach() for p in _no_dropout_objective(tiny_model_dir, tmp_path)[0].parameters()]
    whole_loss, whole = updated[0]
    assert any(not torch.equal(a, b) for a, b in zip(whole, start))  # it stepped
    for loss, params in updated[1:]:
        assert loss == pytest.approx(whole_loss, abs=1e-6)  # the mean of the batches' means = the whole batch's mean
        for a, b in zip(params, whole):
            assert torch.allclose(a, b, rtol=0, atol=1e-6)


def _accumulating_worker(rank: int, world: int, model_dir: str, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(rank)
    objective = make_objective(model_dir)
    wrapped = torch.nn.parallel.DistributedDataParallel(objective)
    synced_at: list[int] = []
    current = [0]

    def counting_hook(state, bucket):  # DDP's gradient all-reduce, per bucket
        synced_at.append(current[0])

        return allreduce_hook(None, bucket)

    wrapped.register_comm_hook(None, counting_hook)
    optimizer, scheduler, scaler = optimizer_for(objective, 0.01)
    micro = []
    for rows in (ROWS[:2], ROWS[2:]) if rank == 0 else (ROWS[1:3], ROWS[3:] + ROWS[:1]):
        batch = triples_to_batch(rows)
        micro.append((objective.model.encode(batch.queries, batch.documents).inputs, batch.structure))
    accumulated_step(wrapped, objective, optimizer, scheduler, scaler, micro, 1.0,
                     before_each=lambda index: current.__setitem__(0, index))
    torch.save({"synced_at": synced_at, "params": [p.detach() for p in objective.parameters()]}, f"{out_dir}/acc-{rank}.pt")
    dist.destroy_process_group()


def test_data_parallel_accumulation_syncs_once_on_the_last_batch(tiny_model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_accumulating_worker, args=(2, str(tiny_model_dir), port, str(tmp_path)), nprocs=2, join=True)
    first, second = torch.load(tmp_path / "acc-0.pt"), torch.load(tmp_path / "acc-1.pt")
    assert first["synced_at"] and set(first["synced_at"]) == {1}  # only the last of the 2 batches all-reduced
    for a, b in zip(first["params"], second["params"]):  # and both workers stepped with the averaged gradient
        assert torch.allclose(a, b, atol=1e-6)


def test_a_micro_batched_step_replays_each_micro_batchs_own_dropout(tiny_model_dir):
    """Micro-batches smaller than the step with dropout on: the gradient equals a plain chunked
    forward under the same RNG stream (each chunk draws its own masks, in order), which a replay
    of one chunk's RNG state for every chunk would not give."""
    objective = make_objective(tiny_model_dir)
    batch = triples_to_batch(ROWS)  # 16 pairs
    pairs = objective.model.encode(batch.queries, batch.documents)
    objective.train()

    class Chunked(TrainingObjective):  # the reference: the same chunks, in order, with plain autograd
        def pairs(self, inputs):
            n = next(iter(inputs.values())).shape[0]
            out = [self.encode_pairs({k: v[s:s + 5] for k, v in inputs.items()}) for s in range(0, n, 5)]
            return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])

    reference = Chunked(objective.model, objective.loss_fn, None)
    expected = _step_gradients(reference, pairs.inputs, batch.structure, None, seed=5)
    _assert_same(_step_gradients(objective, pairs.inputs, batch.structure, 5, seed=5), expected)
    plain = _step_gradients(objective, pairs.inputs, batch.structure, None, seed=5)  # one forward: other masks
    assert not torch.allclose(plain[1]["model.score_head.weight"], expected[1]["model.score_head.weight"])
