"""Search a store of corpus embeddings with faiss: exact inner product, or HNSW where the corpus is large.

- ``flat``: exact maximum inner product, block by block (a ``faiss.IndexFlatIP`` over each
  block read from the store, the blocks' top k merged in a ``faiss.ResultHeap``): memory is
  one block whatever the corpus, and the result is the exact top k (tested against numpy).
- ``hnsw``: ``faiss.IndexHNSWFlat`` with the inner-product metric (M links per node,
  efConstruction, efSearch): approximate, sub-linear per query, the whole matrix in memory.
  Built once per store and parameters and kept beside the store (``hnsw-<params>.faiss``).
- ``auto``: hnsw above ``hnsw_threshold`` documents, else flat.

Row ids come back as rows of the store; :func:`search_store` turns them into document ids.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from workloads.core.logs import get_logger
from workloads.core.paths import exclusive
from workloads.kinds.dense.store import EmbeddingStore

INDEX_METHODS = ("auto", "flat", "hnsw")
HNSW_THRESHOLD = 1_000_000
BLOCK_ROWS = 65536


@dataclass(frozen=True)
class HNSWParams:
    m: int = 32                 # links per node
    ef_construction: int = 200  # candidate list while building
    ef_search: int = 256        # candidate list while searching (at least k)

    @property
    def file_name(self) -> str:
        return f"hnsw-m{self.m}-efc{self.ef_construction}.faiss"


def _faiss():
    import faiss

    return faiss


def flat_search(store: EmbeddingStore, queries: np.ndarray, k: int, block_rows: int = BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` inner products of ``queries`` [Q, D] over the store: (scores [Q, k'], rows [Q, k']),
    best first, k' = min(k, rows)."""
    faiss = _faiss()
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, store.rows)
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for start, block in store.blocks(block_rows):
        index = faiss.IndexFlatIP(store.dim)
        index.add(block)
        scores, rows = index.search(queries, min(k, len(block)))
        heap.add_result(scores, np.where(rows >= 0, rows + start, -1))
    heap.finalize()
    return heap.D, heap.I


def hnsw_index(store: EmbeddingStore, params: HNSWParams = HNSWParams()):
    """The store's HNSW index under ``params``: read from beside the store, else built and kept there."""
    faiss = _faiss()
    path = store.directory / params.file_name
    with exclusive(path):
        if path.is_file():
            return faiss.read_index(str(path))
        started = time.perf_counter()
        index = faiss.IndexHNSWFlat(store.dim, params.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.ef_construction
        for _, block in store.blocks():
            index.add(block)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        faiss.write_index(index, str(temporary))
        temporary.replace(path)
        get_logger("dense").info(f"HNSW index of {store.rows:,} rows built in {time.perf_counter() - started:.1f} s")
        return index


def hnsw_search(index, queries: np.ndarray, k: int, params: HNSWParams = HNSWParams()) -> tuple[np.ndarray, np.ndarray]:
    index.hnsw.efSearch = max(params.ef_search, k)
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), min(k, index.ntotal))


def chosen_method(method: str, rows: int, threshold: int = HNSW_THRESHOLD) -> str:
    if method not in INDEX_METHODS:
        raise ValueError(f"unknown index '{method}' (choose from {', '.join(INDEX_METHODS)})")
    if method == "auto":
        return "hnsw" if rows > threshold else "flat"
    return method


def search_rows(store: EmbeddingStore, queries: np.ndarray, k: int, method: str = "flat", threshold: int = HNSW_THRESHOLD,
                params: HNSWParams = HNSWParams()) -> tuple[np.ndarray, np.ndarray]:
    """(scores, rows) of the top ``k`` rows per query under ``method`` (see the module doc)."""
    if store.rows == 0 or k < 1:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    if chosen_method(method, store.rows, threshold) == "hnsw":
        return hnsw_search(hnsw_index(store, params), queries, k, params)
    return flat_search(store, queries, k)


def search_store(store: EmbeddingStore, query_ids: list[str], queries: np.ndarray, k: int, method: str = "flat",
                 threshold: int = HNSW_THRESHOLD, params: HNSWParams = HNSWParams()) -> dict[str, dict[str, float]]:
    """The run: query id -> {doc id: inner product} of its top ``k`` documents."""
    scores, rows = search_rows(store, queries, k, method, threshold, params)
    ids = store.ids
    run: dict[str, dict[str, float]] = {}
    for qid, row_scores, row_ids in zip(query_ids, scores, rows):
        run[qid] = {ids[int(r)]: float(s) for s, r in zip(row_scores, row_ids) if r >= 0}
    return run


__all__ = ["HNSW_THRESHOLD", "INDEX_METHODS", "HNSWParams", "chosen_method", "flat_search", "hnsw_index", "hnsw_search",
           "search_rows", "search_store"]
