"""DiffCSE as its authors run it (voidism/DiffCSE): the pooler fed one batch of every view on the
raw embedding, the masked-LM generator path (80/10/10, argmax at every position), RTD averaged over
every padded position, and the conditioning reaching the encoder through DenseObjective itself."""

import json
import math

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertModel

from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.objectives import (
    LinearTanhPooler,
    ProjectionPooler,
    build_pooler,
    pool_views,
)
from workloads.kinds.dense.spec import DenseSpec, DenseTrialSpec, dense_key
from workloads.kinds.dense.train import DenseBatch, DenseObjective

TEXTS = ["dense retrieval of scientific claims", "a protein binds the receptor", "vitamin d and bone density",
         "the trial measured mortality"]
POSITIVES = ["claims checked against abstracts", "the receptor is bound by a protein", "bone density and vitamin d",
             "mortality was the trial's outcome"]
NEGATIVES = ["an unrelated passage on rainfall", "the committee met on tuesday"]
BASE = {"kind": "dense", "name": "d", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = BertConfig.from_pretrained(tiny_model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    encoder = BiEncoder(BertModel(config, add_pooling_layer=False), tokenizer, pooling="cls", normalize=True)
    return encoder, tokenizer, config


def _batch(encoder, negatives=True):
    return DenseBatch(encoder.tokenize(TEXTS, "query"), encoder.tokenize(POSITIVES, "document"),
                      encoder.tokenize(NEGATIVES, "document") if negatives else None, "query", torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- the pooler
def test_pool_views_joint_is_one_batchnorm_batch_and_per_view_one_each_by_hand():
    norm = nn.BatchNorm1d(1, affine=False, eps=1e-12).train()
    a, p = torch.tensor([[1.0], [3.0]]), torch.tensor([[5.0], [7.0]])
    # joint: mean 4, biased variance (9 + 1 + 1 + 9) / 4 = 5 over the four rows
    joint = pool_views(norm, True, [a, p, None])
    assert joint[2] is None
    assert torch.allclose(torch.cat(joint[:2]).squeeze(1), torch.tensor([-3.0, -1.0, 1.0, 3.0]) / math.sqrt(5), atol=1e-6)
    # per view: each view's own statistics, so both become (-1, 1)
    per_view = pool_views(norm, False, [a, p, None])
    assert all(torch.allclose(v.squeeze(1), torch.tensor([-1.0, 1.0]), atol=1e-6) for v in per_view[:2])


def test_the_poolers_are_the_authors_layers():
    assert [type(m).__name__ for m in build_pooler("batchnorm_joint", 8).net] == [
        "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    assert isinstance(build_pooler("batchnorm_per_view", 8), ProjectionPooler)
    tanh = build_pooler("linear_tanh", 8)
    assert isinstance(tanh, LinearTanhPooler) and tanh.dense.bias is not None  # SimCSE's MLPLayer: Linear(H, H), tanh
    x = torch.randn(3, 8)
    assert torch.allclose(tanh(x), torch.tanh(x @ tanh.dense.weight.T + tanh.dense.bias))
    assert build_pooler("none", 8) is None
    with pytest.raises(ValueError, match="unknown pooler 'mlp'"):
        build_pooler("mlp", 8)


def _contrastive_by_hand(encoder, pooler, joint, raw):
    """The contrastive loss re-computed with torch: embeddings (raw or normalised) through the pooler in train mode."""
    with torch.no_grad():
        views = [encoder(side, **encoder.tokenize(texts, side)) if not raw else
                 encoder.tower(side)(**encoder.tokenize(texts, side)).last_hidden_state[:, 0]
                 for texts, side in ((TEXTS, "query"), (POSITIVES, "document"), (NEGATIVES, "document"))]
        if joint:
            pooled = pooler.net(torch.cat(views)).split([4, 4, 2])
        else:
            pooled = [pooler.net(v) for v in views]
        a, p, n = (nn.functional.normalize(v, dim=-1) for v in pooled)
        logits = a @ torch.cat([p, n]).T / 0.05
        return -torch.log_softmax(logits, dim=1).diagonal().mean().item()


@pytest.mark.parametrize(("pooler", "joint", "raw"), [("batchnorm_joint", True, True), ("batchnorm_per_view", False, False)])
def test_dense_objective_feeds_the_pooler_as_named(tiny, pooler, joint, raw):
    encoder, _, _ = tiny
    spec = DenseSpec(pooler=pooler) if pooler != "batchnorm_joint" else DenseSpec(objective="diffcse")
    torch.manual_seed(1)
    module = build_pooler(pooler, encoder.hidden_size)
    objective = DenseObjective(encoder, spec, module).eval()
    module.train()  # BatchNorm on the batch's statistics, as while training; the encoder has no dropout
    loss = objective(_batch(encoder)).item()
    assert loss == pytest.approx(_contrastive_by_hand(encoder, module, joint, raw), abs=1e-5)
    other = _contrastive_by_hand(encoder, module, not joint, not raw)
    assert abs(loss - other) > 1e-3  # the other feeding is another loss


def test_the_pooler_defaults_per_objective_and_only_diffcse_keys_move():
    assert DenseSpec().pooler == "batchnorm_per_view" and DenseSpec(objective="diffcse").pooler == "batchnorm_joint"
    assert DenseSpec(pooler="mlp").pooler == "batchnorm_per_view"  # the former name still reads
    assert DenseSpec.model_validate(DenseSpec(objective="diffcse").model_dump()) == DenseSpec(objective="diffcse")
    # keys computed before issue 57: contrastive trials train as before and keep theirs
    golden = {"{}": "cafd780e163f13bc", '{"pooler": "none"}': "13c9ea0bafcd4d5b",
              '{"unsupervised": true}': "4bc0ba2dc9607988", '{"pooler": "mlp"}': "cafd780e163f13bc"}
    for dense, key in golden.items():
        assert dense_key(DenseTrialSpec.model_validate({**BASE, "dense": json.loads(dense)})) == key, dense
    # diffcse trials moved on purpose (the pooler's feeding, RTD's averaging, the MLM generator path)
    diffcse_before = {"62d4fc96518f20d5", "8ea390ffee70aa7e"}
    for dense in ({"objective": "diffcse"},):
        assert dense_key(DenseTrialSpec.model_validate({**BASE, "dense": dense})) not in diffcse_before
