"""The dense trial's test and keep.

Test: the chosen epoch's encoder embeds the whole test corpus (a store keyed by the encoder's
and the corpus's content, :func:`workloads.kinds.dense.store.corpus_store`) and every test
query; exact inner-product search (faiss flat, :func:`workloads.kinds.dense.index.search_store`)
ranks the top :data:`TEST_DEPTH` per query, measured with the retrieval measures (nDCG@10,
R@100, ...). This is the dense run the trial reports and that the paired tests compare with
BM25's test run (:attr:`PreparedDense.first_stage_test`) on the same queries.

Keep: the chosen encoder (without the training-time pooler and the discriminator) in
``<cache>/dense/<objective>-<key>/model``, the result file last: what a dense first stage loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path
from workloads.data.resolve import resolve_collection
from workloads.evaluation import RETRIEVAL_MEASURES, evaluate
from workloads.evaluation.reranking import Reranking
from workloads.kinds.dense.index import search_store
from workloads.kinds.dense.prepare import PreparedDense
from workloads.kinds.dense.spec import COMPLETE_MARKER, MODEL_DIR, DenseTrialSpec, dense_dir, dense_key
from workloads.kinds.dense.store import corpus_store
from workloads.kinds.dense.training import load_encoder

TEST_DEPTH = 1000  # as BM25's baseline run: R@100 and the paired tests read the same depth on both sides

Run = dict[str, dict[str, float]]


def dense_run(checkpoint: Path, spec: DenseTrialSpec, collection_ref: str, queries: dict[str, str], depth: int = TEST_DEPTH,
              device: torch.device | None = None) -> Run:
    """The top ``depth`` documents of ``collection_ref``'s corpus for each query, by exact search."""
    device = device or torch.device("cpu")
    encoder = load_encoder(str(Path(checkpoint) / MODEL_DIR), spec).to(device)
    collection = resolve_collection(collection_ref)
    precision = spec.precision if spec.precision != "auto" else "fp32"  # the store's key names its precision
    store = corpus_store(encoder, collection, precision, batch_size=spec.dense.eval_batch_size, device=device)
    query_ids = list(queries)
    embedded = encoder.encode_queries([queries[q] for q in query_ids], batch_size=spec.dense.eval_batch_size,
                                      device=device, precision=precision)
    return search_store(store, query_ids, embedded, depth, method="flat")


def test_dense(checkpoint: Path, prepared: PreparedDense, spec: DenseTrialSpec, chosen: dict, device=None) -> Reranking:
    """The chosen encoder's retrieval on the test queries: exact search over the test corpus."""
    run = dense_run(checkpoint, spec, prepared.test_collection, prepared.test_queries, device=device)
    return Reranking(evaluate(run, prepared.test_qrels, prepared.test_relevance_level, RETRIEVAL_MEASURES), run)


test_dense.__test__ = False  # a trial step, not a pytest test


def keep_dense(spec: DenseTrialSpec, checkpoint: Path, summary: dict, device=None) -> Path:
    """Keep the chosen encoder, the result file last."""
    final = dense_dir(spec)
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        shutil.copytree(Path(checkpoint) / MODEL_DIR, tmp / MODEL_DIR)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"key": dense_key(spec), "spec": spec.model_dump(mode="json"),
                                                        **summary}, indent=1, sort_keys=True))
    get_logger("dense").info(f"dense trial {spec.name} -> {final}")
    return final


__all__ = ["TEST_DEPTH", "dense_run", "keep_dense", "test_dense"]
