"""Augmenters: ordering by score, k_a, determinism by seed, short documents, GloVe OOV, caching."""

import gzip
import math
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.kinds.rerank.augmentation import build_augmentation_sets, rows_without_sentences, select_sentences
from workloads.kinds.rerank.augmentation.scorers import BM25SentenceScorer, GloVeScorer, RandomScorer, SentenceStatistics
from workloads.kinds.rerank.batching import triples_to_batch
from workloads.kinds.rerank.spec import AugmentationSpec
from workloads.kinds.rerank.train import with_augmentation
from workloads.kinds.rerank.training_sets import TRAINING_SCHEMA
from workloads.text.glove import load_glove, resolve_glove_path
from workloads.text.sentences import document_sentences, split_sentences

DOC = ("Cats are small mammals. They sleep a lot, e.g. sixteen hours per day. "
       "Purring is how cats signal comfort. J. Smith et al. studied purring in 2001. Dogs bark.")


def test_sentence_splitter_is_rule_based_and_keeps_abbreviations():
    assert split_sentences(DOC) == [
        "Cats are small mammals.",
        "They sleep a lot, e.g. sixteen hours per day.",
        "Purring is how cats signal comfort.",
        "J. Smith et al. studied purring in 2001.",
        "Dogs bark.",
    ]
    assert split_sentences("") == [] and split_sentences("no final stop") == ["no final stop"]


def test_bm25_orders_by_score_and_keeps_k():
    sentences = split_sentences(DOC)
    scorer = BM25SentenceScorer(SentenceStatistics.of([sentences, ["Fish swim.", "Birds fly."]]))
    scores = scorer.scores("cats purring comfort", sentences, random.Random(0))
    kept = select_sentences(scores, sentences, 2)
    assert kept == ["Purring is how cats signal comfort.", "Cats are small mammals."]  # by score, not document order
    assert scores[4] == 0.0  # "Dogs bark." shares no word with the query
    # a rarer word weighs more: "purring" occurs in 1 of 2 documents, like "cats"; "fish" in the other only
    assert scorer.idf("cats") == scorer.idf("fish") == math.log(1 + 1.5 / 1.5)
    assert scorer.statistics.document_frequency("sleep") == 1 and scorer.statistics.document_frequency("zebra") == 0
    assert scorer.idf("zebra") == math.log(1 + 2.5 / 0.5)  # a word no document holds: df 0


def test_fewer_sentences_than_k_keeps_all_ordered():
    sentences = ["Dogs bark.", "Cats purr."]
    scorer = BM25SentenceScorer(SentenceStatistics.of([sentences]))
    assert select_sentences(scorer.scores("cats", sentences, random.Random(0)), sentences, 5) == ["Cats purr.", "Dogs bark."]


def test_random_is_deterministic_by_seed():
    sentences = split_sentences(DOC)
    pick = lambda seed: select_sentences(RandomScorer().scores("q", sentences, random.Random(seed)), sentences, 3)  # noqa: E731
    assert pick(1) == pick(1)
    assert len({tuple(pick(s)) for s in range(10)}) > 1
    assert all(len(pick(s)) == 3 and set(pick(s)) <= set(sentences) for s in range(5))


@pytest.fixture()
def glove_file(tmp_path):
    path = tmp_path / "vectors.txt.gz"
    with gzip.open(path, "wt") as out:
        out.write("cats 1 0\npurr 1 1\ndogs -1 0\nbark 0 -1\n")
    return path


def test_glove_scores_mean_vector_dot_product_and_oov(glove_file):
    scorer = GloVeScorer(*load_glove(glove_file))
    # query "cats purr zzz" -> mean(cats, purr) = (1, .5) ("zzz" is out of vocabulary and skipped)
    scores = scorer.scores("cats purr zzz", ["Dogs bark.", "Cats purr.", "Unknown words only."], random.Random(0))
    assert scores == pytest.approx([(1 * -0.5) + (0.5 * -0.5), 1 * 1 + 0.5 * 0.5, 0.0])
    assert scorer.oov_texts == 1  # the sentence with no known word, scored 0 explicitly
    assert scorer.scores("qqq", ["Cats purr."], random.Random(0)) == [0.0] and scorer.oov_texts == 2


def test_glove_bad_file(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("cats 1 0\ndogs 1\n")
    with pytest.raises(InputError, match=r"bad.txt:2: expected 2 values, got 1"):
        load_glove(bad)


def test_real_glove_subset_covers_scifact_words():
    words, vectors = load_glove(resolve_glove_path("glove/glove.6B.50d.top100k.txt.gz"))
    assert vectors.shape == (100_000, 50) and "protein" in words


def toy_collection():
    corpus = {
        "d1": Document("d1", "Feline notes", DOC),
        "d2": Document("d2", "", "Dogs bark loudly. Dogs run."),
        "d3": Document("d3", "", "Fish swim. Fish eat."),
        "d4": Document("d4", "", "Birds fly south."),
    }
    return Collection("toy", corpus, {"q1": "cats purring comfort"}, {"train": {"q1": {"d1": 1}}})


def write_training_set(path, positives=("d1",) * 3):
    rows = [{"query_id": "q1", "query": "cats purring comfort", "positive_id": p, "positive": DOC,
             "negative_id": "d2", "negative": "Dogs bark loudly. Dogs run."} for p in positives]
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_SCHEMA), path)
    return path


def test_augmentation_set_is_stored_once_and_reused(tmp_path, project_log):
    collection = toy_collection()
    training = write_training_set(tmp_path / "train-abc.parquet")
    spec = AugmentationSpec(method="bm25", k=2, seed=1)
    [path] = build_augmentation_sets(collection, "train", training, spec)
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 3
    assert rows[0]["augmented_positive"] == "Purring is how cats signal comfort. Cats are small mammals."
    assert rows[0]["sentences_kept"] == 2 and rows[0]["sentences_total"] == 6  # the title is a candidate too
    assert all(r["augmented_negative_id"] != "d1" for r in rows)  # never a relevant document
    mtime = path.stat().st_mtime_ns
    assert build_augmentation_sets(collection, "train", training, spec) == [path] and path.stat().st_mtime_ns == mtime
    assert any("reusing" in r.getMessage() for r in project_log.records)
    [other] = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="random", k=2, seed=1))
    assert other != path
    assert rows_without_sentences(path) == 0



def test_title_is_a_candidate_sentence_of_its_own():
    assert document_sentences(Document("d", "Purring  cats", "Dogs bark. Fish swim.")) == ["Purring cats", "Dogs bark.", "Fish swim."]
    assert document_sentences(Document("d", "Only a title", "")) == ["Only a title"]
    assert document_sentences(Document("d", "", "")) == []


def test_title_only_document_is_augmented_with_its_title_and_an_empty_one_gets_no_pair(tmp_path):
    collection = toy_collection()
    collection.corpus["d5"] = Document("d5", "Cats purring for comfort", "")  # title only: its one sentence is the title
    collection.corpus["d6"] = Document("d6", "", "   ")                      # nothing at all
    collection.qrels["train"]["q1"].update({"d5": 1, "d6": 1})
    training = write_training_set(tmp_path / "train-empty.parquet", positives=("d1", "d5", "d6"))
    [path] = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="bm25", k=2, seed=1))
    rows = pq.read_table(path).to_pylist()
    assert rows[1]["augmented_positive"] == "Cats purring for comfort"
    assert rows[2]["augmented_positive"] is None and rows[2]["augmented_negative"] is None and rows[2]["sentences_total"] == 0
    assert rows_without_sentences(path) == 1  # counted from the file's statistics
    triples = pq.read_table(training).to_pylist()
    batch = triples_to_batch(with_augmentation(triples, str(path), str(training)))
    # 3 triples -> 6 pairs, + 2 augmented pairs for d1 and d5 only: no empty text is trained as relevant
    assert len(batch.documents) == 10 and "" not in batch.documents
    assert batch.structure.labels.sum().item() == 5


def test_per_epoch_redraw_is_seeded_and_epoch_one_equals_a_single_draw(tmp_path):
    collection = toy_collection()
    training = write_training_set(tmp_path / "train-redraw.parquet", positives=("d1",) * 12)
    once = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="random", k=2, seed=1, redraw="once"), 3)
    per_epoch = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="random", k=2, seed=1), 3)
    assert len(once) == 1 and len(per_epoch) == 3 and per_epoch[0] == once[0]
    epochs = [pq.read_table(p).to_pylist() for p in per_epoch]
    negatives = [[r["augmented_negative_id"] for r in rows] for rows in epochs]
    sentences = [[r["augmented_positive"] for r in rows] for rows in epochs]
    assert negatives[0] != negatives[1] != negatives[2] and sentences[0] != sentences[1]  # drawn anew each epoch
    assert all(n not in {"d1"} for epoch in negatives for n in epoch)
    bm25 = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="bm25", k=2, seed=1), 2)
    bm25_rows = [pq.read_table(p).to_pylist() for p in bm25]
    assert [r["augmented_positive"] for r in bm25_rows[0]] == [r["augmented_positive"] for r in bm25_rows[1]]  # a ranking
    # rebuilt from scratch elsewhere: the same draws (seeded per row and epoch)
    os.environ["ORCHESTRATE_CACHE_DIR"], saved = str(tmp_path / "other-cache"), os.environ["ORCHESTRATE_CACHE_DIR"]
    try:
        again = build_augmentation_sets(collection, "train", training, AugmentationSpec(method="random", k=2, seed=1), 3)
    finally:
        os.environ["ORCHESTRATE_CACHE_DIR"] = saved
    assert [pq.read_table(p).to_pylist() for p in again] == epochs
