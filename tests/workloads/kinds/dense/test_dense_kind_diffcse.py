"""DiffCSE as its authors run it (voidism/DiffCSE): the pooler fed one batch of every view on the
raw embedding, the masked-LM generator path (80/10/10, argmax at every position), RTD averaged over
every padded position, and the conditioning reaching the encoder through DenseObjective itself."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.generator import MaskedLMGenerator, mlm_input
from workloads.kinds.dense.objectives import (
    ConditionalDiscriminator,
    LinearTanhPooler,
    ProjectionPooler,
    build_pooler,
    draw_mask,
    maskable,
    pool_views,
    replaced_token_detection,
    rtd_labels,
)
from workloads.kinds.dense.spec import DenseSpec, DenseTrialSpec, dense_key
from workloads.kinds.dense.train import DenseBatch, DenseObjective, load_encoder

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
    with pytest.raises(ValueError, match="rtd_average: read by objective diffcse only"):
        DenseSpec(rtd_average="real_tokens")
    # diffcse trials moved on purpose (the pooler's feeding, RTD's averaging, the MLM generator path)
    diffcse_before = {"62d4fc96518f20d5", "8ea390ffee70aa7e"}
    for dense in ({"objective": "diffcse"}, {"objective": "diffcse", "pooler": "none"}):
        assert dense_key(DenseTrialSpec.model_validate({**BASE, "dense": dense})) not in diffcse_before


# ----------------------------------------------------------------------------- the masked-LM generator
class _PeakedMLM(nn.Module):
    """A stand-in masked LM whose argmax at every position is (its input token + shift) mod V."""

    def __init__(self, vocab_size: int, shift: int) -> None:
        super().__init__()
        self.config, self.shift = SimpleNamespace(vocab_size=vocab_size), shift

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=nn.functional.one_hot((input_ids + self.shift) % self.config.vocab_size,
                                                            self.config.vocab_size).float())


def test_the_generator_input_is_80_percent_mask_10_random_10_kept():
    ids = torch.full((200, 500), 7)
    masked = torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) < 0.3
    out = mlm_input(ids, masked, mask_token_id=103, vocab_size=30522, draws=torch.Generator().manual_seed(1))
    assert torch.equal(out[~masked], ids[~masked])  # only drawn positions change
    drawn = out[masked]
    shares = [(drawn == 103).float().mean().item(), ((drawn != 103) & (drawn != 7)).float().mean().item(),
              (drawn == 7).float().mean().item()]
    assert shares == pytest.approx([0.8, 0.1, 0.1], abs=0.01)  # 30,000 drawn positions


def test_the_generators_argmax_is_taken_at_every_real_position_but_the_first():
    ids = torch.tensor([[101, 5, 6, 7, 8, 102, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    nothing_masked = torch.zeros_like(ids, dtype=torch.bool)
    shifting = MaskedLMGenerator(_PeakedMLM(200, shift=1), mask_token_id=103)
    corrupted = shifting.fill(ids, attention, nothing_masked, torch.Generator().manual_seed(0))
    # unmasked tokens and [SEP] are re-predicted too (the authors' argmax over the whole text); [CLS] and padding kept
    assert corrupted.tolist() == [[101, 6, 7, 8, 9, 103, 0]]
    assert rtd_labels(ids, corrupted, attention).tolist() == [[0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]]


def test_a_token_the_generator_reproduces_is_not_replaced_through_rtd(tiny):
    encoder, tokenizer, config = tiny
    inputs = encoder.tokenize([" ".join(["protein receptor binding"] * 20)] * 4, "document")
    special = sorted(set(tokenizer.all_special_ids))
    copying = MaskedLMGenerator(_PeakedMLM(config.vocab_size, shift=0), tokenizer.mask_token_id)
    discriminator = ConditionalDiscriminator(BertModel(config, add_pooling_layer=False))
    condition = torch.zeros(4, config.hidden_size)
    outcome = replaced_token_detection(discriminator, copying, inputs, condition, 0.5, special, torch.Generator().manual_seed(2))
    # by hand, replaying the step's draws: the mask, then the 80/10/10 split; the copying MLM returns its input
    draws = torch.Generator().manual_seed(2)
    masked = draw_mask(maskable(inputs["input_ids"], inputs["attention_mask"], special), 0.5, draws)
    shown = mlm_input(inputs["input_ids"], masked, tokenizer.mask_token_id, config.vocab_size, draws)
    real = inputs["attention_mask"].bool()
    changed = (shown != inputs["input_ids"]) & real
    assert outcome.replaced.item() == pytest.approx(changed.sum().item() / real.sum().item(), abs=1e-6)
    kept = masked & ~changed
    assert kept.sum() > 0 and outcome.replaced.item() < masked.sum().item() / real.sum().item()  # the kept 10% are original


def test_a_tiny_masked_lm_fills_as_the_authors_generator():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                        max_position_embeddings=32)
    model = BertForMaskedLM(config)
    generator = MaskedLMGenerator(model, mask_token_id=4)
    assert not model.training and not any(p.requires_grad for p in model.parameters())  # frozen
    ids = torch.tensor([[2, 10, 11, 12, 13, 14, 3], [2, 20, 21, 22, 3, 0, 0]])
    attention = (ids != 0).long()
    masked = torch.tensor([[0, 1, 0, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0]], dtype=torch.bool)
    corrupted = generator.fill(ids, attention, masked, torch.Generator().manual_seed(5))
    with torch.no_grad():
        shown = mlm_input(ids, masked, 4, 50, torch.Generator().manual_seed(5))
        argmax = model(input_ids=shown, attention_mask=attention).logits.argmax(-1)
    expected = torch.where(attention.bool(), argmax, ids)
    expected[:, 0] = ids[:, 0]
    assert torch.equal(corrupted, expected)
    labels = rtd_labels(ids, corrupted, attention)
    assert labels[:, 0].sum() == 0 and labels[1, 5:].sum() == 0  # [CLS] and padding never replaced
    assert (labels.bool() & ~masked & attention.bool()).any()  # a random MLM changes unmasked tokens too


# ----------------------------------------------------------------------------- RTD through DenseObjective
def _encoder_gradient(encoder, config, rtd_lambda, pooler="batchnorm_joint"):
    torch.manual_seed(3)
    discriminator = ConditionalDiscriminator(BertModel(config, add_pooling_layer=False))
    generator = MaskedLMGenerator(_PeakedMLM(config.vocab_size, shift=1), encoder.tokenizer.mask_token_id)
    objective = DenseObjective(encoder, DenseSpec(objective="diffcse", rtd_lambda=rtd_lambda, pooler=pooler),
                               build_pooler(pooler, encoder.hidden_size), discriminator, generator)
    encoder.zero_grad(set_to_none=True)
    objective(_batch(encoder)).backward()
    return torch.cat([p.grad.flatten() for p in encoder.parameters() if p.grad is not None])


def test_the_rtd_loss_of_dense_objective_trains_the_encoder_through_h(tiny):
    encoder, _, config = tiny
    contrastive_only = _encoder_gradient(encoder, config, 0.0)
    with_rtd = _encoder_gradient(encoder, config, 1.0)
    # the discriminator is its own copy and the generator's tokens carry no gradient: only h links RTD to the encoder
    assert (with_rtd - contrastive_only).abs().max() > 1e-6


def test_rtd_in_dense_objective_averages_as_set(tiny):
    encoder, _, config = tiny
    texts = ["a", "a much longer text about proteins binding receptors in the cell"]  # one row mostly padding
    batch = DenseBatch(encoder.tokenize(texts, "query"), encoder.tokenize(texts, "document"), None, "query",
                       torch.Generator().manual_seed(0))
    parts = {}
    for average in ("padded", "real_tokens"):
        torch.manual_seed(3)
        discriminator = ConditionalDiscriminator(BertModel(config, add_pooling_layer=False))
        generator = MaskedLMGenerator(_PeakedMLM(config.vocab_size, shift=1), encoder.tokenizer.mask_token_id)
        objective = DenseObjective(encoder, DenseSpec(objective="diffcse", rtd_average=average), None, discriminator,
                                   generator).eval()
        batch.draws.manual_seed(0)
        objective(batch)
        parts[average] = objective.loss_fn.last_parts["rtd"].item()
    # the shift MLM replaces every real token but [CLS]: the two means weigh them differently
    assert parts["padded"] != pytest.approx(parts["real_tokens"], rel=1e-3)


def test_a_trial_trains_and_keeps_a_normalising_encoder(tiny_model_dir):
    spec = DenseTrialSpec.model_validate({**BASE, "model": {"name": str(tiny_model_dir), "pooling": "cls"}})
    encoder = load_encoder(str(tiny_model_dir), spec)  # a plain BERT: it declares no normalisation of its own
    embeddings = encoder.encode_documents(TEXTS)
    assert encoder.normalize and embeddings == pytest.approx(embeddings / ((embeddings ** 2).sum(1, keepdims=True) ** 0.5))
    assert (abs((embeddings ** 2).sum(1) - 1) < 1e-5).all()
