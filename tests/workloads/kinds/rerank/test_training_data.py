"""Size-N training sets: counts, determinism, nesting, validation carving."""

import json

import pyarrow.parquet as pq
import pytest

from orchestrator.lifecycle.identity import trial_key
from workloads.core.errors import InputError
from workloads.data.resolve import resolve_collection
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.steps import _training_queries
from workloads.kinds.rerank.training_sets import (
    build_training_set,
    capped_validation_queries,
    carve_validation_queries,
    sample_triples,
    select_size,
)
from workloads.retrieval.bm25 import read_trec_run, retrieve
from workloads.retrieval.first_stage import FirstStageRun

RUN = {
    "q1": {"p1": 9.0, "n1": 8.0, "n2": 7.0, "p2": 6.0, "n3": 5.0},
    "q2": {"n4": 3.0, "p3": 2.0},
    "q3": {"p4": 1.0},  # no negative retrieved: skipped and counted
    "q4": {"n5": 1.0},  # no positive retrieved
}
QRELS = {"q1": {"p1": 1, "p2": 2, "n1": 0}, "q2": {"p3": 1, "p9": 1}, "q3": {"p4": 1}, "q4": {"p5": 1}}


def test_one_uniform_negative_per_retrieved_positive():
    triples, stats = sample_triples(RUN, QRELS, ["q1", "q2", "q3", "q4"], relevance_level=1, depth=5, seed=0)
    assert sorted((t.query_id, t.positive_id) for t in triples) == [("q1", "p1"), ("q1", "p2"), ("q2", "p3")]
    for t in triples:
        assert QRELS[t.query_id].get(t.negative_id, 0) < 1 and t.negative_id in RUN[t.query_id]
    assert (stats.positives_judged, stats.positives_retrieved, stats.queries_without_negative, stats.triples) == (6, 4, 1, 3)


def test_depth_and_relevance_level_limit_candidates():
    triples, _ = sample_triples(RUN, QRELS, ["q1"], relevance_level=1, depth=3, seed=0)
    assert [t.positive_id for t in triples] == ["p1"]  # p2 is at rank 4
    assert {t.negative_id for t in triples} <= {"n1", "n2"}
    graded, _ = sample_triples(RUN, QRELS, ["q1"], relevance_level=2, depth=5, seed=0)
    assert [t.positive_id for t in graded] == ["p2"]  # p1 has grade 1 < 2 and becomes a negative candidate


def test_negatives_are_uniform_over_retrieved_non_relevant():
    counts = {"n1": 0, "n2": 0, "p2": 0, "n3": 0}
    for seed in range(600):
        triples, _ = sample_triples({"q": RUN["q1"]}, {"q": {"p1": 1}}, ["q"], 1, 5, seed)
        counts[triples[0].negative_id] += 1
    # p2 is unjudged here, so it is a negative candidate too: 4 candidates, ~150 each
    assert all(100 < c < 200 for c in counts.values()), counts


def test_select_size_counts_pairs_and_refuses_too_large():
    triples, _ = sample_triples(RUN, QRELS, list(QRELS), 1, 5, 0)
    assert len(select_size(triples, 2, "x")) == 1
    assert len(select_size(triples, "full", "x")) == 3
    with pytest.raises(InputError, match="size 100 needs 50 triples but the first stage yields only 3"):
        select_size(triples, 100, "x")


def test_validation_carving_is_deterministic_and_disjoint():
    ids = [f"q{i}" for i in range(100)]
    train, validation = carve_validation_queries(ids, 10, "x")
    assert len(validation) == 10 and not set(train) & set(validation) and len(train) == 90
    assert carve_validation_queries(list(reversed(ids)), 10, "x") == (train, validation)
    with pytest.raises(InputError, match="cannot carve 100 validation queries from 100"):
        carve_validation_queries(ids, 100, "x")


def test_scifact_size_n_sets_real(scifact_dir, monkeypatch):
    collection = resolve_collection(str(scifact_dir))
    train_ids, _ = carve_validation_queries(list(collection.split_queries("train")), 50, "x")
    queries = collection.split_queries("train")
    _, run_path = retrieve(collection, {q: queries[q] for q in train_ids}, k=100)
    sets = {}
    for size, seed in [(100, 1), (1000, 1), (1000, 1), (1000, 2)]:
        path, stats = build_training_set(collection, "train", train_ids, FirstStageRun(run_path), 100, size, seed)
        sets[(size, seed)] = (path, pq.read_table(path).to_pylist())
    assert len(sets[(100, 1)][1]) == 50 and len(sets[(1000, 1)][1]) == 500  # N counts pairs: N/2 triples
    assert sets[(1000, 1)][1][:50] == sets[(100, 1)][1]  # nested for the same seed
    assert sets[(1000, 1)][1] != sets[(1000, 2)][1]  # another seed, another sample
    rows = sets[(1000, 1)][1]
    qrels = collection.split_qrels("train")
    for row in rows:
        assert qrels[row["query_id"]].get(row["positive_id"], 0) >= 1
        assert qrels[row["query_id"]].get(row["negative_id"], 0) < 1
        assert row["query_id"] in train_ids
        assert row["positive"] == collection.document(row["positive_id"]).contents
    # stored once and reused: asking again returns the same file untouched
    path = sets[(1000, 1)][0]
    before = path.stat().st_mtime_ns
    # found by its key: the run is not read again, and the statistics come stored with the set
    with monkeypatch.context() as patched:
        patched.setattr(FirstStageRun, "rankings", lambda *a: pytest.fail("read the run of a set already built"))
        patched.setattr(FirstStageRun, "run", property(lambda self: pytest.fail("read the run of a set already built")))
        again, again_stats = build_training_set(collection, "train", train_ids, FirstStageRun(run_path), 100, 1000, 1)
    assert again == path and path.stat().st_mtime_ns == before
    assert again_stats == sample_triples(read_trec_run(run_path), collection.split_qrels("train"), train_ids, 1, 100, 1)[1]
    assert again_stats.triples > 500 and again_stats.queries == len(train_ids)


def test_a_validation_cap_draws_the_same_queries_whatever_the_trial():
    ids = [f"q{i}" for i in range(5_193)]  # MS MARCO dev's size
    capped = capped_validation_queries(ids, 500)
    assert len(capped) == 500 == len(set(capped)) and set(capped) <= set(ids) and capped == sorted(capped)
    assert capped_validation_queries(list(reversed(ids)), 500) == capped  # order of the split does not matter
    assert capped_validation_queries(ids, 400) != capped[:400]  # another cap is another draw, still fixed
    assert capped_validation_queries(ids, None) == sorted(ids) == capped_validation_queries(ids, 10_000)


def _beir_with_dev(root, dev_queries: int):
    (root / "qrels").mkdir(parents=True)
    ids = {"train": range(0, 10), "dev": range(10, 10 + dev_queries), "test": range(100, 105)}
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{q}", "title": "", "text": f"document {q}"}) + "\n"
                                               for split in ids.values() for q in split))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{q}", "text": f"query {q}"}) + "\n"
                                                for split in ids.values() for q in split))
    for split, queries in ids.items():
        (root / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                    + "".join(f"q{q}\td{q}\t1\n" for q in queries))
    return root


def test_a_validation_cap_applies_to_a_validation_split_and_keys_only_when_set(tmp_path):
    root = _beir_with_dev(tmp_path / "dev20", 20)
    base = {"name": "cap", "data": {"collection": str(root), "validation_split": "dev"}, "model": {"name": "m"}}
    spec = TrialSpec.model_validate(base)
    capped = TrialSpec.model_validate({**base, "data": {**base["data"], "validation_cap": 5}})
    collection = resolve_collection(str(root))
    whole, few = _training_queries(spec, collection), _training_queries(capped, collection)
    assert len(whole[2]) == 20 and len(few[2]) == 5 and set(few[2]) <= set(whole[2]) and set(few[3]) == set(few[2])
    assert few[:2] == whole[:2]  # training queries untouched
    assert trial_key(capped) != trial_key(spec)
    with pytest.raises(ValueError, match="validation_cap caps a validation_split"):
        TrialSpec.model_validate({**base, "data": {"collection": str(root), "validation_cap": 5}})


def test_a_run_read_one_query_at_a_time_gives_the_same_rankings_and_triples(tmp_path):
    """A training split's run is read per query through an index of its lines (MS MARCO's is
    36.7M lines): the same rankings as reading it whole, for a file whose queries are
    interleaved, with blank lines, and for a query it does not rank."""
    path = tmp_path / "run.trec"
    lines = [f"q{q} Q0 d{d} {r} {10 - r + q * 0.5:.6f} t" for q in range(6) for r, d in enumerate(range(q, q + 8), 1)]
    lines = lines[:20] + [""] + lines[40:] + lines[20:40]  # q2's lines split in two places, q5 before q2-q4
    path.write_text("\n".join(lines) + "\n")
    ids = [f"q{i}" for i in (3, 0, 9, 5, 2, 1, 4)]
    whole = read_trec_run(path)
    assert list(FirstStageRun(path).rankings(ids)) == [(q, whole.get(q, {})) for q in ids]
    qrels = {f"q{q}": {f"d{q + 1}": 1, f"d{q + 5}": 2} for q in range(6)}
    ids = [f"q{q}" for q in range(6)]
    assert sample_triples(FirstStageRun(path), qrels, ids, 1, 6, seed=4) == sample_triples(whole, qrels, ids, 1, 6, seed=4)
    assert sample_triples(FirstStageRun(path), qrels, ids, 1, 6, seed=4, negatives=3) == \
        sample_triples(whole, qrels, ids, 1, 6, seed=4, negatives=3)
