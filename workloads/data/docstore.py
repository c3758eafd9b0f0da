"""A corpus on disk, looked up by document id without being held in memory.

A local BEIR corpus (``corpus.jsonl[.gz]``) is converted once per content into a store in the
cache: the documents as an Arrow IPC file in record batches of :data:`BATCH_ROWS`, in the
file's order, and an index of 64-bit id hashes sorted with their row numbers. Every process
memory-maps both, so a lookup reads one document and a process's memory does not grow with
the corpus (MS MARCO document: 3.2M documents, ~22 GB of text). The conversion streams the
file: its memory is one batch plus 16 bytes per document for the index.

Written here because nothing in the stack does it for a local file: ir_datasets' docstores
serve its own datasets (those are read through it, :class:`workloads.data.collections`), and
Arrow has no keyed lookup, so the hash index is ours.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, exclusive
from workloads.data.document import Document

BATCH_ROWS = 8192
STORE_VERSION = 1
SCHEMA = pa.schema([("doc_id", pa.string()), ("title", pa.string()), ("text", pa.string())])
_DOCUMENTS, _HASHES, _ROWS, _SORTED, _META = "documents.arrow", "hashes.npy", "rows.npy", "sorted-ids.arrow", "store.json"

_log = get_logger("docstore").info


def id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode(), digest_size=8).digest(), "little")


class DocStore(Mapping):
    """The documents of a converted corpus (:func:`build_docstore`), memory-mapped.

    ``DocStore.reads`` counts the documents any store of this process decoded (a lookup or a
    document streamed): what a warm preparation must leave at zero."""

    reads = 0

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._opened = None
        self._batches: list[pa.RecordBatch | None] = []

    def __getstate__(self) -> dict:  # a store travels to Ray tasks as its path; each process maps it
        return {"directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"])

    def _open(self):
        if self._opened is None:
            reader = pa.ipc.open_file(pa.memory_map(str(self.directory / _DOCUMENTS)))
            self._opened = (reader, np.load(self.directory / _HASHES, mmap_mode="r"),
                            np.load(self.directory / _ROWS, mmap_mode="r"), json.loads((self.directory / _META).read_text()))
            self._batches = [None] * reader.num_record_batches
            self._batch_rows = self._opened[3]["batch_rows"]  # as built, whatever BATCH_ROWS says now
        return self._opened

    def _row(self, doc_id: str) -> int | None:
        reader, hashes, rows, _ = self._open()
        wanted = np.uint64(id_hash(doc_id))
        position = int(np.searchsorted(hashes, wanted))
        while position < len(hashes) and hashes[position] == wanted:  # 64-bit collisions: compare the ids
            row = int(rows[position])
            if self._column(row, 0) == doc_id:
                return row
            position += 1
        return None

    def _batch(self, index: int) -> pa.RecordBatch:
        # kept once read: a batch over the memory map costs its metadata only, and reading the
        # metadata again is most of a lookup's time
        batches = self._batches
        if batches[index] is None:
            batches[index] = self._open()[0].get_batch(index)
        return batches[index]

    def _column(self, row: int, column: int):
        return self._batch(row // self._batch_rows).column(column)[row % self._batch_rows].as_py()

    def __getitem__(self, doc_id: str):
        row = self._row(doc_id)
        if row is None:
            raise KeyError(doc_id)
        batch = self._batch(row // self._batch_rows)
        offset = row % self._batch_rows
        DocStore.reads += 1
        return Document(doc_id, batch.column(1)[offset].as_py(), batch.column(2)[offset].as_py())

    def __contains__(self, doc_id: object) -> bool:
        return isinstance(doc_id, str) and self._row(doc_id) is not None

    def __len__(self) -> int:
        return self._open()[3]["documents"]

    def _scan(self) -> Iterator[pa.RecordBatch]:
        """Every batch in file order, read (not mapped): a scan of the whole corpus would otherwise
        leave all of it in the process's resident pages."""
        with pa.OSFile(str(self.directory / _DOCUMENTS)) as source:
            reader = pa.ipc.open_file(source)
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)

    def __iter__(self) -> Iterator[str]:
        for batch in self._scan():
            yield from batch.column(0).to_pylist()

    def values(self):  # type: ignore[override]  # stream the documents in file order
        for batch in self._scan():
            DocStore.reads += batch.num_rows
            for doc_id, title, text in zip(*(batch.column(c).to_pylist() for c in range(3))):
                yield Document(doc_id, title, text)

    def sorted_ids(self) -> Sequence[str]:
        """Every id in sorted order (Python's string order), memory-mapped."""
        return ArrowIds(self.directory / _SORTED)


class ArrowIds(Sequence):
    """Ids stored as one Arrow string column (:func:`write_ids`), memory-mapped: a sequence of
    ``str`` that ``random.choice`` draws from as from a list, without a list of them all."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.array = pa.ipc.open_file(pa.memory_map(str(path))).get_batch(0).column(0)

    def __reduce__(self):  # travels as its path, mapped again where it lands
        return ArrowIds, (self.path,)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.array[index].to_pylist()
        return self.array[index].as_py()


def write_ids(ids: pa.Array, path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("doc_id", pa.string())])) as writer:
        writer.write_batch(pa.record_batch([ids], names=["doc_id"]))


def _batches(records: Iterator[tuple[str, str, str]]) -> Iterator[pa.RecordBatch]:
    columns: tuple[list, list, list] = ([], [], [])
    for record in records:
        for column, value in zip(columns, record):
            column.append(value)
        if len(columns[0]) == BATCH_ROWS:
            yield pa.record_batch([pa.array(c, pa.string()) for c in columns], schema=SCHEMA)
            columns = ([], [], [])
    if columns[0]:
        yield pa.record_batch([pa.array(c, pa.string()) for c in columns], schema=SCHEMA)


def build_docstore(records: Iterator[tuple[str, str, str]], directory: Path, source: Path) -> DocStore:
    """Convert (doc id, title, text) records into a store at ``directory``, once: concurrent
    processes wait for the first. ``source`` names the file in errors (a duplicate id, no document)."""
    if (directory / _META).exists():
        return DocStore(directory)
    with exclusive(directory):
        if (directory / _META).exists():  # built by another process while this one waited
            return DocStore(directory)
        started = time.perf_counter()
        with atomic_path(directory) as work:
            work.mkdir(parents=True)
            hashes: list[np.ndarray] = []
            with pa.OSFile(str(work / _DOCUMENTS), "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as writer:
                try:
                    for batch in _batches(records):
                        writer.write_batch(batch)
                        hashes.append(np.fromiter((id_hash(d) for d in batch.column(0).to_pylist()), np.uint64,
                                                  batch.num_rows))
                except UnicodeEncodeError as exc:  # a lone surrogate escape ("\ud800") in the JSON
                    raise InputError(source, f"text that is not valid Unicode ({exc.reason}) after document "
                                             f"{sum(len(h) for h in hashes):,}") from None
            every_hash = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
            if not len(every_hash):
                raise InputError(source, "empty corpus: no documents")
            order = np.argsort(every_hash, kind="stable")
            np.save(work / _HASHES, every_hash[order])
            np.save(work / _ROWS, order.astype(np.int64))
            ids = pa.ipc.open_file(pa.memory_map(str(work / _DOCUMENTS))).read_all().column(0)
            _refuse_duplicates(every_hash[order], order, ids, source)
            # UTF-8 byte order is code point order: the order of Python's sorted()
            write_ids(pc.take(ids, pc.sort_indices(ids)).combine_chunks(), work / _SORTED)
            (work / _META).write_text(json.dumps({"documents": len(every_hash), "version": STORE_VERSION,
                                                  "batch_rows": BATCH_ROWS, "source": str(source)}))
        _log(f"stored {len(every_hash):,} documents of {source} in {time.perf_counter() - started:.1f}s -> {directory}")
    return DocStore(directory)


def _refuse_duplicates(hashes: np.ndarray, rows: np.ndarray, ids: pa.ChunkedArray, source: Path) -> None:
    """Ids of equal hashes are compared: a document id given twice is an error (which text is meant?)."""
    starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], len(hashes)]):
        if end - start < 2:
            continue
        seen: set[str] = set()
        for row in sorted(int(r) for r in rows[start:end]):
            doc_id = ids[row].as_py()
            if doc_id in seen:
                raise InputError(source, f"document '{doc_id}' appears twice (record {row + 1}): which text is meant? "
                                         "give every document one _id")
            seen.add(doc_id)


__all__ = ["DocStore", "ArrowIds", "build_docstore", "write_ids", "BATCH_ROWS", "STORE_VERSION"]
