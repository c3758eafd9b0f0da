"""In-batch negatives gathered across data-parallel workers (SimCSE's all-gather): two CPU
processes (gloo) against one process with the doubled batch, dropout and BatchNorm off."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoTokenizer, BertConfig, BertModel

from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.spec import DenseSpec, DenseTrialSpec, dense_key
from workloads.kinds.dense.train import DenseBatch, DenseObjective
from workloads.training.step import data_parallel

ANCHORS = ["dense retrieval of claims", "a protein binds the receptor", "vitamin d and bone density",
           "the trial measured mortality"]
POSITIVES = ["claims checked against abstracts", "the receptor is bound by a protein", "bone density and vitamin d",
             "mortality was the trial's outcome"]
NEGATIVES = [["rainfall in spring"], ["a committee met", "the market fell"], ["a poem about rivers"], []]  # uneven


def _objective(model_dir: str, gather: bool = True) -> DenseObjective:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = BertConfig.from_pretrained(model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    encoder = BiEncoder(BertModel(config, add_pooling_layer=False), tokenizer, pooling="cls", normalize=True)
    return DenseObjective(encoder, DenseSpec(pooler="none", gather=gather), None)  # no BatchNorm: rows are independent


def _batch(encoder: BiEncoder, rows: range) -> DenseBatch:
    negatives = [n for i in rows for n in NEGATIVES[i]]
    return DenseBatch(encoder.tokenize([ANCHORS[i] for i in rows], "query"),
                      encoder.tokenize([POSITIVES[i] for i in rows], "document"),
                      encoder.tokenize(negatives, "document") if negatives else None, "query", torch.Generator())


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        rows = range(2 * rank, 2 * rank + 2)
        objective = _objective(model_dir)
        wrapped = data_parallel(objective, 2, torch.device("cpu"), find_unused_parameters=True)
        wrapped.train()
        loss = wrapped(_batch(objective.encoder, rows))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in objective.named_parameters() if p.grad is not None}
        own = _objective(model_dir, gather=False).train()
        own_loss = own(_batch(own.encoder, rows))
        torch.save({"loss": loss.item(), "grads": grads, "own_loss": own_loss.item()}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, tiny_model_dir) -> list[dict]:
    out = tmp_path_factory.mktemp("gather")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tiny_model_dir), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def test_two_gathering_workers_train_as_one_process_on_the_doubled_batch(two_workers, tiny_model_dir):
    single = _objective(str(tiny_model_dir)).train()
    loss = single(_batch(single.encoder, range(4)))
    loss.backward()
    # every worker's loss is the whole batch's
    assert two_workers[0]["loss"] == pytest.approx(loss.item(), abs=1e-5) == two_workers[1]["loss"]
    # each worker's gradient reaches its own shard only and DDP averages the two: 1/2 of one process's
    for name, p in single.named_parameters():
        if p.grad is not None:
            assert torch.allclose(2 * two_workers[0]["grads"][name], p.grad, atol=1e-5, rtol=1e-4), name
            assert torch.equal(two_workers[0]["grads"][name], two_workers[1]["grads"][name])


def test_without_gather_each_worker_contrasts_its_own_rows(two_workers, tiny_model_dir):
    objective = _objective(str(tiny_model_dir)).train()
    own = [objective(_batch(objective.encoder, range(2 * r, 2 * r + 2))).item() for r in range(2)]
    assert [r["own_loss"] for r in two_workers] == pytest.approx(own, abs=1e-5)
    assert own != pytest.approx([two_workers[0]["loss"]] * 2, abs=1e-3)  # half the negatives: another loss


def test_gather_moves_only_the_keys_of_trials_with_several_workers():
    base = {"kind": "dense", "name": "d", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}

    def key(workers, **dense):
        return dense_key(DenseTrialSpec.model_validate({**base, "dense": dense, "resources": {"workers": workers}}))

    assert key(1) == key(1, gather=False) == key(4, gather=False) == "cafd780e163f13bc"  # as before issue 57
    assert key(4) != key(1)
