"""The dense kind's objectives against hand values: RTD labels and loss, the conditioning of
the discriminator on the sentence embedding, and the contrastive loss (SimCSE's, lambda = 0)."""

import math

import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.generator import FrequencyGenerator
from workloads.kinds.dense.objectives import (
    ConditionalDiscriminator,
    ProjectionPooler,
    draw_mask,
    in_batch_contrastive,
    maskable,
    replaced_token_detection,
    rtd_labels,
    rtd_loss,
)
from workloads.kinds.dense.spec import DenseSpec
from workloads.kinds.dense.train import DenseBatch, DenseObjective


def test_rtd_labels_mark_replaced_real_tokens_only():
    original = torch.tensor([[101, 5, 6, 7, 102, 0]])
    # position 3 was masked and refilled with its own token: original; position 5 is padding
    corrupted = torch.tensor([[101, 9, 6, 7, 102, 4]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    assert rtd_labels(original, corrupted, mask).tolist() == [[0.0, 1.0, 0.0, 0.0, 0.0, 0.0]]


def test_rtd_loss_averages_over_the_padded_batch_by_default_or_over_real_tokens():
    logits = torch.tensor([[0.0, math.log(3), -math.log(3), 5.0]])
    labels = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])  # the last is padding
    # -log sigmoid(0) = log 2; -log sigmoid(log 3) = log 4/3; -log (1 - sigmoid(-log 3)) = log 4/3
    real = math.log(2) + 2 * math.log(4 / 3)
    assert rtd_loss(logits, labels, mask, "real_tokens").item() == pytest.approx(real / 3, abs=1e-6)
    # the authors': every position, padding labelled 0 (-log (1 - sigmoid(5)) = log(1 + e^5)), over 4
    padded = (real + math.log(1 + math.exp(5))) / 4
    assert rtd_loss(logits, labels, mask).item() == pytest.approx(padded, abs=1e-6)


def test_in_batch_contrastive_is_simcse_by_hand():
    anchors = torch.tensor([[1.0, 0.0], [0.0, 2.0]])        # cosine: the norms do not matter
    positives = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    t = 0.5
    c = 1 / math.sqrt(2)
    row1 = -math.log(math.exp(1 / t) / (math.exp(1 / t) + math.exp(c / t)))
    row2 = -math.log(math.exp(c / t) / (math.exp(0 / t) + math.exp(c / t)))
    assert in_batch_contrastive(anchors, positives, None, t).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)
    # a hard negative joins every row's denominator
    negative = torch.tensor([[0.0, 1.0]])
    row1 = -math.log(math.exp(1 / t) / (math.exp(1 / t) + math.exp(c / t) + math.exp(0 / t)))
    row2 = -math.log(math.exp(c / t) / (math.exp(0 / t) + math.exp(c / t) + math.exp(1 / t)))
    assert in_batch_contrastive(anchors, positives, negative, t).item() == pytest.approx((row1 + row2) / 2, abs=1e-6)


@pytest.fixture(scope="module")
def tiny_parts(tiny_model_dir):
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = BertConfig.from_pretrained(tiny_model_dir)
    encoder = BiEncoder(BertModel(config, add_pooling_layer=False), tokenizer, pooling="cls", normalize=True)
    texts = ["dense retrieval of scientific claims", "a protein binds the receptor", "vitamin d and bone density",
             "the trial measured mortality"]
    return encoder, tokenizer, config, texts


def _objective(encoder, config, texts, **settings):
    spec = DenseSpec(objective="diffcse", **settings)
    discriminator = ConditionalDiscriminator(BertModel(config, add_pooling_layer=False))
    generator = FrequencyGenerator.from_texts(encoder.tokenizer, texts)
    return DenseObjective(encoder, spec, None, discriminator, generator)


def _batch(encoder, texts, seed=0):
    return DenseBatch(encoder.tokenize(texts, "query"), encoder.tokenize(texts, "document"), None, "query",
                      torch.Generator().manual_seed(seed))


def test_lambda_zero_is_the_contrastive_loss_alone(tiny_parts):
    encoder, _, config, texts = tiny_parts
    objective = _objective(encoder, config, texts, rtd_lambda=0.0).eval()  # no dropout: embeddings by hand
    loss = objective(_batch(encoder, texts))
    with torch.no_grad():
        anchors = encoder("query", **encoder.tokenize(texts, "query"))
        positives = encoder("document", **encoder.tokenize(texts, "document"))
        cosine = anchors @ positives.T  # normalised
        by_hand = -torch.log_softmax(cosine / 0.05, dim=1).diagonal().mean()
    assert loss.item() == pytest.approx(by_hand.item(), abs=1e-5)
    assert objective.loss_fn.last_parts["rtd"].item() > 0  # RTD was computed, weighted by 0
    weighted = _objective(encoder, config, texts, rtd_lambda=0.5).eval()
    weighted.discriminator.load_state_dict(objective.discriminator.state_dict())
    assert weighted(_batch(encoder, texts)).item() == pytest.approx(
        by_hand.item() + 0.5 * objective.loss_fn.last_parts["rtd"].item(), abs=1e-5)


def test_the_rtd_gradient_reaches_the_encoder_through_the_condition(tiny_parts):
    encoder, tokenizer, config, texts = tiny_parts
    discriminator = ConditionalDiscriminator(BertModel(config, add_pooling_layer=False))
    generator = FrequencyGenerator.from_texts(tokenizer, texts)
    inputs = encoder.tokenize(texts, "document")
    special = sorted(set(tokenizer.all_special_ids))

    def encoder_gradient(condition_of):
        encoder.zero_grad(set_to_none=True)
        condition = condition_of(encoder("document", **inputs))
        outcome = replaced_token_detection(discriminator, generator, inputs, condition, 0.3, special,
                                           torch.Generator().manual_seed(1))
        outcome.loss.backward()
        grads = [p.grad for p in encoder.parameters() if p.grad is not None]
        return sum(float(g.abs().sum()) for g in grads)

    assert encoder_gradient(lambda h: h) > 0                # L_RTD alone trains the encoder, through h
    assert encoder_gradient(lambda h: h.detach()) == 0      # and only through h
    # the condition changes what the discriminator predicts
    corrupted = inputs["input_ids"]
    h = torch.randn(len(texts), config.hidden_size)
    with torch.no_grad():
        first = discriminator(corrupted, inputs["attention_mask"], h)
        second = discriminator(corrupted, inputs["attention_mask"], h * 3)
    assert not torch.allclose(first, second)


def test_masks_and_frequency_replacements_touch_only_maskable_tokens(tiny_parts):
    encoder, tokenizer, _, texts = tiny_parts
    inputs = encoder.tokenize(texts, "document")
    allowed = maskable(inputs["input_ids"], inputs["attention_mask"], sorted(set(tokenizer.all_special_ids)))
    assert not allowed[:, 0].any()  # [CLS] is never masked (it carries the condition)
    masked = draw_mask(allowed, 0.5, torch.Generator().manual_seed(3))
    assert masked.any() and not (masked & ~allowed).any()
    generator = FrequencyGenerator.from_texts(tokenizer, texts)
    filled = generator.fill(inputs["input_ids"], inputs["attention_mask"], masked, torch.Generator().manual_seed(3))
    assert torch.equal(filled[~masked], inputs["input_ids"][~masked])
    seen = {i for t in texts for i in tokenizer(t, add_special_tokens=False)["input_ids"]}
    assert set(filled[masked].tolist()) <= seen  # drawn from the training texts' tokens


def test_the_projection_pooler_is_diffcses_mlp_with_batchnorm():
    pooler = ProjectionPooler(8)
    layers = [type(m).__name__ for m in pooler.net]
    assert layers == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    out = pooler.train()(torch.randn(6, 8))
    assert out.shape == (6, 8)
    assert out.mean(0).abs().max() < 1e-5  # the last BatchNorm (no affine) centres each dimension
