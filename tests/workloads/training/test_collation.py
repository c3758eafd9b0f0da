"""Batches padded from the stored ids with numpy (``workloads.text.tokenized.pad_stored``): exactly the
tensors ``tokenizer.pad`` made (keys, order, dtype, side, pad ids, lengths), so the same
training steps and scores; and the fixed-shape padding of a compiled encoder."""

import copy
import gzip
import json

import pytest
import torch

from workloads.kinds.rerank.batching import plan_epoch
from workloads.kinds.rerank.spec import LossSpec
from workloads.kinds.rerank.train import prefetched, training_pairs
from workloads.losses import build_loss
from workloads.models.cross_encoder import CrossEncoder, EncodedPairs, score_pairs
from workloads.text.tokenized import cut_documents, pad_features, pad_stored, tokenize_pairs
from workloads.training import TrainingObjective
from workloads.training.step import accumulated_step, adamw


@pytest.fixture(scope="module")
def pairs(scifact_dir):
    """SciFact pairs of many lengths (most abstracts truncated at 64 tokens, short ones padded),
    a query longer than max_length and a one-character document."""
    with gzip.open(scifact_dir / "corpus.jsonl.gz", "rt") as corpus:
        documents = [f"{d['title']} {d['text']}" for d in (json.loads(next(corpus)) for _ in range(48))]
    with open(scifact_dir / "queries.jsonl") as lines:
        queries = [json.loads(next(lines))["text"] for _ in range(16)]
    documents[5] = documents[5][:40]  # short pairs: padding inside a batch
    documents[9] = documents[9][:15]
    pairs = [(queries[i % 16], documents[i]) for i in range(48)] + [("why " * 90, documents[0]), ("a query", ".")]
    return [q for q, _ in pairs], [d for _, d in pairs]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=64)


def reference_encode(model, queries, documents, tokenized):
    """The stored-ids path as it was (617b804): per-pair lists from Arrow, ``tokenizer.pad``."""
    features = tokenized.features(queries, documents)
    missing = [i for i, feature in enumerate(features) if feature is None]
    if missing:
        fresh = tokenize_pairs(model.tokenizer, [queries[i] for i in missing], [documents[i] for i in missing], model.max_length)
        for j, i in enumerate(missing):
            features[i] = {name: values[j] for name, values in fresh.items()}
    return pad_features(model.tokenizer, features)


def assert_same(expected: dict, actual: dict) -> None:
    assert list(expected) == list(actual)
    for key in expected:
        assert expected[key].dtype == actual[key].dtype == torch.int64, key
        assert torch.equal(expected[key], actual[key]), key


def _batches(queries, documents):
    """Batches of stored pairs, of stored and new pairs mixed, and of new pairs only."""
    n = len(queries)
    yield queries[:16], documents[:16]
    yield queries[16:n], documents[16:n]  # the long query and the one-character document
    yield [queries[0], "a new query", queries[5], queries[9]], [documents[0], "a new document about cells", documents[5],
                                                                 documents[9]]
    yield ["only new", "pairs here"], ["nothing stored", "at all, none"]
    yield queries[9:10], documents[9:10]  # a batch of one


@pytest.mark.parametrize("side", ["right", "left"])
def test_numpy_padding_gives_exactly_the_tensors_of_tokenizer_pad(pairs, model, side):
    queries, documents = pairs
    stored = model.tokenized(queries, documents)
    tokenizer = copy.deepcopy(model.tokenizer)
    tokenizer.padding_side = side
    padded = 0
    for q, d in _batches(queries, documents):
        rows = stored.rows(q, d)
        missing = [i for i, row in enumerate(rows) if row is None]
        fresh = tokenize_pairs(tokenizer, [q[i] for i in missing], [d[i] for i in missing], 64) if missing else None
        features = stored.features(q, d)
        for j, i in enumerate(missing):
            features[i] = {name: values[j] for name, values in fresh.items()}
        expected = pad_features(tokenizer, copy.deepcopy(features))
        assert_same(expected, pad_stored(tokenizer, stored, rows, fresh))
        # fixed shapes: padded to max_length, as tokenizer.pad(padding="max_length") pads
        assert_same(pad_features(tokenizer, features, 64), pad_stored(tokenizer, stored, rows, fresh, 64))
        padded += int((expected["attention_mask"] == 0).sum())
    assert padded > 100  # the batches did pad (on the side asked for)


def test_a_tokenizer_with_other_pad_ids_pads_with_them(pairs, model):
    queries, documents = pairs
    stored = model.tokenized(queries, documents)
    tokenizer = copy.deepcopy(model.tokenizer)
    tokenizer.pad_token = "[UNK]"
    tokenizer._pad_token_type_id = 3  # (read-only property)
    rows = stored.rows(queries[:16], documents[:16])
    features = stored.features(queries[:16], documents[:16])
    new = pad_stored(tokenizer, stored, rows)
    assert_same(pad_features(tokenizer, features), new)
    assert (new["input_ids"] == tokenizer.unk_token_id).any() and (new["token_type_ids"] == 3).any()


def test_encode_gives_the_tensors_of_the_reference_path_and_of_tokenizing(pairs, model):
    queries, documents = pairs
    stored = model.tokenized(queries, documents)
    for q, d in _batches(queries, documents):
        new = model.encode(q, d, stored).inputs
        assert_same(reference_encode(model, q, d, stored), new)
        assert_same(model.encode(q, d).inputs, new)


def test_training_steps_and_scores_are_bit_identical_to_the_reference_path(pairs, model, monkeypatch):
    """A short fp32 training run (dropout on, seeded) through the loop's prefetch thread ends with
    the same weights whether batches are padded by numpy or by ``tokenizer.pad``; scoring gives
    the same scores in the same order."""
    queries, documents = pairs
    rows = [{"query_id": f"q{i % 16}", "query": queries[i], "positive_id": f"d{i}", "positive": documents[i],
             "negative_id": f"d{(i + 7) % 48}", "negative": documents[(i + 7) % 48],
             "augmented_positive": documents[i][:70], "augmented_negative": documents[(i + 3) % 48][:50]}
            for i in range(24)]

    def train_and_score() -> tuple[dict, list[float], list, list]:
        torch.manual_seed(0)
        trained = copy.deepcopy(model)
        objective = TrainingObjective(trained, build_loss(LossSpec(), trained.encoder.config.hidden_size), None)
        optimizer = adamw([{"params": list(objective.parameters())}], lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        stored = trained.tokenized(*training_pairs(rows))
        inputs, losses = [], []
        for epoch in (1, 2):
            planned = plan_epoch(rows, "triples", 8, 1, 16, seed=13, epoch=epoch)
            for batch, encoded in prefetched(trained, rows, planned, "triples", torch.device("cpu"), stored):
                inputs.append(encoded.inputs)
                losses.append(accumulated_step(objective, objective, optimizer, scheduler, scaler,
                                               [(encoded.inputs, batch.structure)], 1.0))
        scores = score_pairs(trained, queries, documents, 8, torch.device("cpu"), precision="fp32",
                             tokenized=trained.tokenized(queries, documents))
        return {k: v.clone() for k, v in trained.state_dict().items()}, scores, inputs, losses

    weights, scores, inputs, losses = train_and_score()
    monkeypatch.setattr(CrossEncoder, "encode", lambda self, q, d, tokenized=None: _reference(self, q, d, tokenized))
    old_weights, old_scores, old_inputs, old_losses = train_and_score()
    assert len(inputs) == 12 and all(encoded["input_ids"].shape[0] == 16 for encoded in inputs)  # augmented pairs too
    for new, old in zip(inputs, old_inputs, strict=True):
        assert_same(old, new)
    assert torch.equal(torch.stack(losses), torch.stack(old_losses))
    assert weights.keys() == old_weights.keys() and all(torch.equal(weights[k], old_weights[k]) for k in weights)
    assert not torch.equal(weights["score_head.weight"], model.state_dict()["score_head.weight"])  # it did train
    assert scores == old_scores and len(set(scores)) > 40


def _reference(model, queries, documents, tokenized):
    if tokenized is None:
        return EncodedPairs(dict(model.tokenizer(queries, cut_documents(model.tokenizer, documents, model.max_length),
                                                 truncation="longest_first", max_length=model.max_length, padding="longest",
                                                 return_tensors="pt")))
    return EncodedPairs(reference_encode(model, queries, documents, tokenized))


def test_scores_come_back_in_input_order_whatever_the_batches(pairs, model):
    queries, documents = pairs
    stored = model.tokenized(queries, documents)
    one_by_one = [score_pairs(model, [q], [d], 1, torch.device("cpu"), precision="fp32")[0]
                  for q, d in zip(queries[-12:], documents[-12:])]
    batched = score_pairs(model, queries, documents, 7, torch.device("cpu"), precision="fp32", tokenized=stored)
    assert batched[-12:] == pytest.approx(one_by_one, abs=1e-5) and len(batched) == len(queries)
    assert score_pairs(model, [], [], 7, torch.device("cpu")) == []


def test_fixed_shapes_pad_to_max_length_and_drop_an_all_ones_mask(pairs, model):
    queries, documents = pairs
    stored = model.tokenized(queries, documents)
    fixed = copy.deepcopy(model)
    fixed.fixed_shapes = True
    full = [i for i in range(48) if stored.ids([i])["input_ids"][1][0] == 64]
    short = [5, 9]
    assert len(full) >= 4
    inputs = fixed.encode([queries[i] for i in full[:4]], [documents[i] for i in full[:4]], stored).inputs
    assert "attention_mask" not in inputs and inputs["input_ids"].shape == (4, 64)
    mixed = [full[0], *short]
    inputs = fixed.encode([queries[i] for i in mixed], [documents[i] for i in mixed], stored).inputs
    assert inputs["input_ids"].shape == (3, 64) and inputs["attention_mask"].sum(1).tolist()[0] == 64
    assert_same(pad_features(model.tokenizer, stored.features([queries[i] for i in mixed], [documents[i] for i in mixed]), 64),
                inputs)
    # on the fly too; a batch without mask scores as the same batch with its all-ones mask
    assert fixed.encode(["a query"], ["."]).inputs["input_ids"].shape == (1, 64)
    fixed.eval()
    batch = fixed.encode([queries[i] for i in full[:4]], [documents[i] for i in full[:4]], stored).inputs
    with torch.no_grad():
        without, _ = fixed(**batch)
        with_mask, _ = fixed(**batch, attention_mask=torch.ones_like(batch["input_ids"]))
    torch.testing.assert_close(without, with_mask)
