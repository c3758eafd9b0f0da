"""Preparation retrieves only the training queries a training set can draw.

A synthetic BEIR-format collection with MS MARCO's shape (one judged-relevant document per
judged query, queries judged only non-relevant besides), prepared by the real `prepare_trial`
with a spy on the first stage: which queries are retrieved, and the rows built, compared with
the rows of the code at 617b804 (its draw, copied below, over the run of every training query).
"""

import json
import random

import pyarrow.parquet as pq
import pytest

import workloads.kinds.rerank.steps as trial
import workloads.kinds.rerank.training_sets as training_sets
from orchestrator.lifecycle.identity import trial_key
from workloads.core.seeds import derived_seed
from workloads.data.resolve import resolve_collection
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import _training_queries
from workloads.kinds.rerank.training_sets import Triple, draw_chunks, drawable_queries, select_size
from workloads.retrieval.first_stage import first_stage_run

WORDS = [f"w{i}" for i in range(400)]


def _old_sample_triples(run, qrels, query_ids, relevance_level, depth, seed):
    """``sample_triples`` of 617b804 (negatives 1), verbatim but for the types: today's sets."""
    rng = random.Random(seed)
    triples = []
    for qid in sorted(query_ids):
        ranking = run.get(qid, {})
        grades = qrels.get(qid, {})
        top = [d for d, _ in sorted(ranking.items(), key=lambda item: (-item[1], item[0]))][:depth]
        positives = [d for d in top if grades.get(d, 0) >= relevance_level]
        pool = [d for d in top if grades.get(d, 0) < relevance_level]
        if positives and not pool:
            continue
        for pos in positives:
            triples.append(Triple(qid, pos, rng.choice(pool)))
    rng.shuffle(triples)
    return triples


@pytest.fixture(scope="module")
def msmarco_shaped(tmp_path_factory):
    """1,200 documents; 400 training queries, 300 judged relevant (one document each, as MS
    MARCO's) and 100 judged only non-relevant; 20 test queries."""
    root = tmp_path_factory.mktemp("msmarco-shaped")
    rng = random.Random(5)
    docs = {f"d{i}": " ".join(rng.choices(WORDS, k=rng.randint(15, 40))) for i in range(1200)}
    queries, train, test = {}, [], []
    for q in range(420):
        target = f"d{rng.randrange(1200)}"
        queries[f"q{q}"] = " ".join(rng.sample(docs[target].split(), 3) + rng.choices(WORDS, k=2))
        grade = 1 if q < 300 or q >= 400 else 0  # q300-q399: judged, none relevant (no training row)
        (test if q >= 400 else train).append(f"q{q}\t{target}\t{grade}\n")
    (root / "qrels").mkdir()
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in docs.items()))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(train))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(test))
    return root


def _spec(root, model, size, seed, queries="all") -> TrialSpec:
    return TrialSpec.model_validate({
        "name": "drawn", "data": {"collection": str(root), "validation_queries": 10},
        "first_stage": {"train_depth": 20, "validation_depth": 5, "test_depth": 5},
        "model": {"name": str(model), "max_length": 32}, "training_data": {"size": size, "seed": seed, "queries": queries}})


def _prepared(spec, monkeypatch):
    """(the training set's rows, every query set the training split was retrieved for)."""
    asked = []
    real = trial.first_stage_run

    def spy(collection, split, queries, k, fs):
        if k == spec.first_stage.train_depth and split == spec.data.train_split:
            asked.append(set(queries))
        return real(collection, split, queries, k, fs)

    monkeypatch.setattr(trial, "first_stage_run", spy)
    prepared = trial.prepare_trial(spec)
    monkeypatch.setattr(trial, "first_stage_run", real)
    return pq.read_table(prepared.training.training_set).to_pylist(), asked


def _full_run(collection, spec, train_ids):
    queries = collection.split_queries("train")
    return first_stage_run(collection, "train", {q: queries[q] for q in train_ids}, spec.first_stage.train_depth,
                           spec.first_stage)


def test_only_queries_that_can_draw_are_retrieved_and_the_rows_are_todays(msmarco_shaped, tiny_model_dir, monkeypatch):
    collection = resolve_collection(str(msmarco_shaped))
    qrels = collection.split_qrels("train")
    for size, seed in [(100, 13), (400, 13), (400, 2)]:
        spec = _spec(msmarco_shaped, tiny_model_dir, size, seed)
        _, train_ids, _, _ = _training_queries(spec, collection)
        rows, asked = _prepared(spec, monkeypatch)
        drawable = set(drawable_queries(train_ids, qrels, 1))
        assert len(train_ids) == 390 and len(drawable) < 300  # 10 carved for validation; 100+ judged only non-relevant
        assert asked == [drawable]  # never the queries that cannot give a row
        # today's rows: 617b804's draw over the run of every training query
        old = select_size(_old_sample_triples(_full_run(collection, spec, train_ids).run, qrels, train_ids, 1, 20, seed),
                          size, "x")
        assert [(r["query_id"], r["positive_id"], r["negative_id"]) for r in rows] == \
            [(t.query_id, t.positive_id, t.negative_id) for t in old]
        assert [(r["query"], r["positive"], r["negative"]) for r in rows] == [
            (collection.queries[t.query_id], collection.document(t.positive_id).contents,
             collection.document(t.negative_id).contents) for t in old]
    # the default is keyed as before the setting existed (617b804's key), as_needed apart
    scifact = {"name": "t", "data": {"collection": "beir/scifact", "validation_queries": 10}, "model": {"name": "minilm-l6"}}
    assert trial_key(TrialSpec.model_validate({**scifact, "training_data": {"size": 200, "seed": 7}})) == "e28cfac7d44c0f16"
    assert trial_key(TrialSpec.model_validate({**scifact, "training_data": {"size": 300, "seed": 7, "negatives": 2},
                                               "optimization": {"batching": "per_query", "batch_size": 15}})) == "26be30430710d781"
    assert trial_key(TrialSpec.model_validate({**scifact, "training_data": {"size": 200, "seed": 7, "queries": "as_needed"}})) \
        != "e28cfac7d44c0f16"


def test_as_needed_retrieves_a_prefix_of_chunks_nested_and_as_the_full_run_draws(msmarco_shaped, tiny_model_dir, monkeypatch):
    """Chunks of 16 doubling to 64 (the real ones are 256 to 16,384): a 40-pair set retrieves
    the first chunks only, a 120-pair set a few more; the smaller set is the larger one's
    prefix; every chunk's rankings are the full run's (rows equal to a draw over it)."""
    monkeypatch.setattr(training_sets, "FIRST_CHUNK", 16)
    monkeypatch.setattr(training_sets, "LARGEST_CHUNK", 64)
    collection = resolve_collection(str(msmarco_shaped))
    qrels = collection.split_qrels("train")
    small, large = (_spec(msmarco_shaped, tiny_model_dir, size, 13, "as_needed") for size in (40, 120))
    _, train_ids, _, _ = _training_queries(small, collection)
    order = drawable_queries(train_ids, qrels, 1)
    random.Random(derived_seed("training-query-order", 13)).shuffle(order)
    chunks = draw_chunks(order)
    assert [len(c) for c in chunks[:4]] == [16, 32, 64, 64]
    small_rows, small_asked = _prepared(small, monkeypatch)
    large_rows, large_asked = _prepared(large, monkeypatch)
    assert len(small_rows) == 20 and len(large_rows) == 60
    assert large_rows[:20] == small_rows  # nested for the same seed
    # retrieval in order, chunk by chunk, and stopped once the set was full
    assert small_asked[0] == set(chunks[0]) and small_asked[1:] == [set(c) for c in chunks[:len(small_asked) - 1]]
    retrieved = set().union(*large_asked)
    assert retrieved == set().union(*chunks[:len(large_asked) - 1]) and len(retrieved) < len(order)
    full = _full_run(collection, large, train_ids)
    drawn, stats = training_sets.draw_as_needed(lambda chunk: full, qrels, train_ids, 1, 20, 13, 1, 60, "x")
    assert [(r["query_id"], r["positive_id"], r["negative_id"]) for r in large_rows] == \
        [(t.query_id, t.positive_id, t.negative_id) for t in drawn[:60]]
    assert stats.queries == len(retrieved)
    for row in large_rows:
        assert qrels[row["query_id"]].get(row["positive_id"], 0) >= 1 and qrels[row["query_id"]].get(row["negative_id"], 0) < 1
    # what as_needed draws, pinned (the seeded order, the chunks, each chunk's draws and shuffle)
    assert [(r["query_id"], r["positive_id"], r["negative_id"]) for r in small_rows[:6]] == [
        ("q260", "d496", "d718"), ("q198", "d372", "d827"), ("q169", "d834", "d39"), ("q184", "d781", "d220"),
        ("q187", "d946", "d465"), ("q113", "d173", "d401")]
