"""BM25 via Pyserini's Anserini reproduces Pyserini's BEIR regression on SciFact."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def orchestrate(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ), cwd=REPO)


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
    from workloads.data.collections import Collection, Document
    from workloads.retrieval.bm25 import BM25Params, retrieve

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
    from workloads.data.collections import resolve_collection
    from workloads.errors import InputError
    from workloads.retrieval.bm25 import prebuilt_index_name, retrieved_run
    from workloads.spec import FirstStageSpec

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
