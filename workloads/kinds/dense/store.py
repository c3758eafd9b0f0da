"""Corpus embeddings on disk, keyed by content: (encoder, corpus, precision) -> one store.

A store is a directory in the cache, ``<cache>/dense/stores/<key>/``: ``embeddings.f32``
(float32 rows, one per document, in the corpus's own order), ``ids.arrow`` (the document id
of each row, memory-mapped as :class:`~workloads.data.docstore.ArrowIds`) and ``store.json``
(rows, dimension, what it was built from), written last. The key hashes the encoder's
content (:meth:`BiEncoder.fingerprint`: its weights, not its name), the collection's
fingerprint and the precision, so the same encoder over the same corpus is encoded once, and
a retrained encoder (other weights) gets a store of its own.

Bounded memory: the corpus is read in chunks of ``chunk_size`` documents, each encoded and
appended to the file with plain writes (no mapping: written pages do not count against the
process), so memory is one chunk's texts and embeddings whatever the corpus size. Search reads
it back in blocks the same way (:meth:`EmbeddingStore.blocks`). Built in a temporary sibling,
renamed into place, under a lock: concurrent trials build it once, a crash leaves nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, exclusive, stable_key
from workloads.data.collections import Collection
from workloads.data.docstore import ArrowIds, write_ids
from workloads.data.document import Document

EMBEDDINGS, IDS, META = "embeddings.f32", "ids.arrow", "store.json"
STORE_VERSION = 1
CHUNK_SIZE = 8192  # documents read, encoded and written at a time


@dataclass(frozen=True)
class EmbeddingStore:
    """A built store: ``rows`` x ``dim`` float32 embeddings and their document ids."""

    directory: Path

    @cached_property
    def meta(self) -> dict:
        return json.loads((self.directory / META).read_text())

    @property
    def rows(self) -> int:
        return int(self.meta["rows"])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @property
    def ids(self) -> ArrowIds:
        return ArrowIds(self.directory / IDS)

    def embeddings(self) -> np.memmap:
        """Every row, memory-mapped read-only (random access; pages count as the process's while touched)."""
        return np.memmap(self.directory / EMBEDDINGS, dtype=np.float32, mode="r", shape=(self.rows, self.dim))

    def blocks(self, rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, block) of at most ``rows`` rows at a time, read (not mapped): a scan holds one block."""
        with open(self.directory / EMBEDDINGS, "rb") as handle:
            for start in range(0, self.rows, rows):
                count = min(rows, self.rows - start)
                block = np.fromfile(handle, dtype=np.float32, count=count * self.dim).reshape(count, self.dim)
                yield start, block


def store_key(encoder_fingerprint: str, corpus_fingerprint: str, precision: str) -> str:
    return stable_key("dense-store", STORE_VERSION, encoder_fingerprint, corpus_fingerprint, precision)


def store_dir(key: str) -> Path:
    return cache_dir() / "dense" / "stores" / key


def _chunks(documents: Iterable[Document], size: int) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    for document in documents:
        chunk.append(document)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def write_store(encoder, documents: Iterable[Document], directory: Path, chunk_size: int = CHUNK_SIZE, batch_size: int = 64,
                precision: str = "fp32", device=None, label: str = "corpus", built_from: dict | None = None) -> EmbeddingStore:
    """Encode ``documents`` (title + text, as BM25 and the cross-encoder read them) with
    ``encoder``'s document tower into a store at ``directory`` (atomically)."""
    log = get_logger("dense")
    started = last = time.perf_counter()
    done = 0
    with atomic_path(directory) as tmp:
        tmp.mkdir()
        id_chunks: list[pa.Array] = []
        with open(tmp / EMBEDDINGS, "wb") as sink:
            for chunk in _chunks(documents, chunk_size):
                embeddings = encoder.encode_documents([d.contents for d in chunk], batch_size=batch_size,
                                                      precision=precision, device=device)
                sink.write(np.ascontiguousarray(embeddings, dtype=np.float32).tobytes())
                id_chunks.append(pa.array([d.doc_id for d in chunk], type=pa.string()))
                done += len(chunk)
                now = time.perf_counter()
                if now - last >= 30:
                    last = now
                    log.info(f"encoding {label}: {done:,} documents ({done / (now - started):.0f}/s)")
        ids = pa.chunked_array(id_chunks, type=pa.string()).combine_chunks() if id_chunks else pa.array([], pa.string())
        write_ids(ids, tmp / IDS)
        seconds = time.perf_counter() - started
        (tmp / META).write_text(json.dumps({"rows": done, "dim": encoder.hidden_size, "precision": precision,
                                            "encode_seconds": round(seconds, 3), **(built_from or {})}))
    log.info(f"encoded {label}: {done:,} documents in {seconds:.1f} s ({done / max(seconds, 1e-9):.0f}/s)")
    return EmbeddingStore(directory)


def corpus_store(encoder, collection: Collection, precision: str = "fp32", chunk_size: int = CHUNK_SIZE,
                 batch_size: int = 64, device=None) -> EmbeddingStore:
    """The store of ``collection``'s corpus under ``encoder``: found by content, else built once."""
    fingerprint = encoder.fingerprint()
    directory = store_dir(store_key(fingerprint, collection.fingerprint, precision))
    if (directory / META).is_file():
        return EmbeddingStore(directory)
    with exclusive(directory):
        if (directory / META).is_file():  # another process built it while this one waited
            return EmbeddingStore(directory)
        corpus = collection.require_corpus()
        return write_store(encoder, corpus.values(), directory, chunk_size, batch_size, precision, device,
                           label=collection.name, built_from={"encoder": fingerprint, "collection": collection.name,
                                                              "corpus": collection.fingerprint})


__all__ = ["CHUNK_SIZE", "EmbeddingStore", "corpus_store", "store_dir", "store_key", "write_store"]
