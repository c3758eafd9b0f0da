"""The corpus store (``workloads.data.docstore``): what a dict of the corpus gave, without the dict."""

import json
import pickle
import random

import pytest

from workloads.core.errors import InputError
from workloads.data import docstore as docstore_module
from workloads.data.collections import sorted_document_ids
from workloads.data.docstore import DocStore, build_docstore
from workloads.data.local_files import load_beir_directory


def write_corpus(path, documents):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in documents))
    return path


def documents(count):
    rng = random.Random(7)
    # ids of varied length and script, so that sorted order and hashing are both exercised
    return [{"_id": f"{rng.choice(['d', 'D', 'é', 'doc-'])}{i * 7919 % 10007}", "title": f"title {i}" if i % 3 else "",
             "text": " ".join(rng.choice(["cats", "purr", "dogs", "bark"]) for _ in range(i % 11))} for i in range(count)]


def records(path):
    for line in path.read_text().splitlines():
        record = json.loads(line)
        yield record["_id"], record.get("title") or "", record["text"]


def test_a_store_gives_every_document_its_sorted_ids_and_streams_in_file_order(tmp_path, monkeypatch):
    monkeypatch.setattr(docstore_module, "BATCH_ROWS", 128)  # many batches
    corpus = write_corpus(tmp_path / "corpus.jsonl", documents(3000))
    store = build_docstore(records(corpus), tmp_path / "store", corpus)
    expected = {r[0]: r for r in records(corpus)}
    assert len(store) == 3000
    for doc_id, (_, title, text) in expected.items():
        document = store[doc_id]
        assert (document.doc_id, document.title, document.text) == (doc_id, title, text)
    assert "nowhere" not in store and "d0" not in store and next(iter(expected)) in store
    with pytest.raises(KeyError):
        store["nowhere"]
    assert list(store) == list(expected) and [d.doc_id for d in store.values()] == list(expected)
    ids = store.sorted_ids()
    assert list(ids) == sorted(expected) and ids[10:13] == sorted(expected)[10:13]
    # random.choice draws from it exactly what it draws from the sorted list (augmentation's negatives)
    first, second = random.Random(5), random.Random(5)
    assert [first.choice(ids) for _ in range(200)] == [second.choice(sorted(expected)) for _ in range(200)]
    travelled = pickle.loads(pickle.dumps(store))
    assert len(pickle.dumps(store)) < 500 and travelled[ids[0]] == store[ids[0]]  # travels as its path


def test_ids_whose_hashes_collide_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(docstore_module, "id_hash", lambda doc_id: len(doc_id))  # every id of a length collides
    corpus = write_corpus(tmp_path / "corpus.jsonl", [{"_id": f"d{i}", "text": f"text {i}"} for i in range(50)])
    store = build_docstore(records(corpus), tmp_path / "store", corpus)
    assert all(store[f"d{i}"].text == f"text {i}" for i in range(50)) and "d50" not in store


def test_a_duplicate_among_colliding_hashes_and_invalid_unicode_are_refused(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus.jsonl", [{"_id": i, "text": "x"} for i in ("a", "b", "a")])
    with monkeypatch.context() as patched:
        patched.setattr(docstore_module, "id_hash", lambda doc_id: 0)  # a, b, a: one run of equal hashes
        with pytest.raises(InputError, match=r"document 'a' appears twice \(record 3\)"):
            build_docstore(records(corpus), tmp_path / "store", corpus)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "half a pair: \\ud800"}\n')
    with pytest.raises(InputError, match="broken.jsonl: text that is not valid Unicode"):
        build_docstore(records(broken), tmp_path / "store", broken)


def test_a_duplicate_id_or_an_empty_corpus_is_one_error_and_leaves_no_store(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", [{"_id": "a", "text": "x"}, {"_id": "b", "text": "y"},
                                                      {"_id": "a", "text": "z"}])
    with pytest.raises(InputError, match=r"corpus.jsonl: document 'a' appears twice \(record 3\)"):
        build_docstore(records(corpus), tmp_path / "store", corpus)
    empty = write_corpus(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputError, match="empty.jsonl: empty corpus: no documents"):
        build_docstore(records(empty), tmp_path / "store", empty)
    assert [p.name for p in tmp_path.iterdir() if "store" in p.name] == ["store.lock"]


def test_a_beir_collection_reads_its_corpus_through_one_store_built_once(tmp_path, shared_cache):
    root = tmp_path / "c"
    write_corpus(root / "corpus.jsonl", documents(500))
    (root / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "cats"}) + "\n")
    (root / "qrels").mkdir()
    first = documents(500)[0]
    (root / "qrels" / "test.tsv").write_text(f"q1\t{first['_id']}\t1\n")
    collection = load_beir_directory(root)
    before = set((shared_cache / "docstores").glob("*")) if (shared_cache / "docstores").is_dir() else set()
    reads = DocStore.reads
    assert len(collection.corpus) == 500 and DocStore.reads == reads  # counting reads no document
    document = collection.document(first["_id"])
    assert DocStore.reads == reads + 1 and document.text == first["text"]
    again = load_beir_directory(root)  # another process or object: the same store, not a second one
    assert again.document(first["_id"]) == document
    built = set((shared_cache / "docstores").glob("*")) - before
    assert len([p for p in built if not p.name.endswith(".lock")]) == 1
    assert list(sorted_document_ids(collection.corpus)) == sorted(d["_id"] for d in documents(500))
