"""Collections from ir_datasets ids (``msmarco-document/trec-dl-2019/judged``, ``beir/<name>``):
downloaded on a connected machine, one clear line offline; corpora too big for memory read
lazily from ir_datasets' docstore. ir_datasets is imported where it is used: loading it costs
seconds, and a local collection never needs it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pyarrow as pa

from workloads.core.errors import InputError
from workloads.core.paths import atomic_path, cache_dir, exclusive, stable_key
from workloads.data.collections import Collection, Qrels
from workloads.data.docstore import ArrowIds, write_ids
from workloads.data.document import Document

_KNOWN_SPLITS = ("train", "dev", "validation", "test")


class _IrdsDocs(Mapping[str, Document]):
    """A lazy corpus over an ir_datasets docs store (MS MARCO does not fit in memory)."""

    def __init__(self, dataset, ref: str):
        self._dataset = dataset
        self._ref = ref
        self._store = None

    def _docs_store(self):
        if self._store is None:
            self._store = _irds_call(self._ref, self._dataset.docs_store)
        return self._store

    def __getitem__(self, doc_id: str) -> Document:
        doc = _irds_call(self._ref, self._docs_store().get, doc_id)
        if doc is None:
            raise KeyError(doc_id)
        return _irds_document(doc)

    def __iter__(self) -> Iterator[str]:
        for doc in _guarded_iter(self._ref, self._dataset.docs_iter):
            yield doc.doc_id

    def __len__(self) -> int:
        return _irds_call(self._ref, self._dataset.docs_count)

    def values(self):  # type: ignore[override]  # stream documents, not lookups by id
        for doc in _guarded_iter(self._ref, self._dataset.docs_iter):
            yield _irds_document(doc)

    def sorted_ids(self) -> Sequence[str]:
        """Every id in sorted order, listed once per corpus (one pass) and memory-mapped after."""
        import ir_datasets

        path = cache_dir() / "document-ids" / f"{stable_key(ir_datasets.docs_parent_id(self._ref.strip('/')))}.arrow"
        if not path.exists():
            with exclusive(path):  # concurrent preparations list the corpus once
                if not path.exists():
                    with atomic_path(path, ".arrow") as tmp:
                        write_ids(pa.array(sorted(iter(self)), pa.string()), tmp)
        return ArrowIds(path)


def _guarded_iter(ref: str, make: Callable[[], Iterator]) -> Iterator:
    """Stream from ir_datasets (a corpus does not fit in memory), its errors as one clear line."""
    try:
        with _quiet_ir_datasets():
            iterator = iter(make())
            first = next(iterator, None)  # a missing corpus downloads here, before anything is yielded
        if first is not None:
            yield first
        yield from iterator
    except InputError:
        raise
    except Exception as exc:
        raise _offline_error(ref, exc) from None


def _irds_document(doc) -> Document:
    text = getattr(doc, "text", None) or getattr(doc, "body", None) or ""
    return Document(doc.doc_id, getattr(doc, "title", "") or "", text)


def _offline_error(ref: str, exc: BaseException) -> InputError:
    """One line for a dataset that is neither local nor downloadable here (offline, or a failed download)."""
    detail = (str(exc).strip().splitlines() or [""])[0][:160]
    local = ref.removeprefix("beir/")
    return InputError(ref, f"not found locally and ir_datasets could not download it ({type(exc).__name__}: {detail}); "
                           f"offline, point $ORCHESTRATE_DATA_DIR at a directory holding '{local}/' (BEIR layout: "
                           "corpus.jsonl, queries.jsonl, qrels/<split>.tsv; or TREC topics and qrels)")


@contextmanager
def _quiet_ir_datasets() -> Iterator[None]:
    """ir_datasets logs every download attempt and retry on loggers of its own; on failure our
    one-line error says it all, so its INFO and WARNING lines are held back meanwhile."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(previous)


def _irds_call(ref: str, fn: Callable, *args):
    """Call into ir_datasets; anything it raises (offline downloads raise many kinds) is one clear line."""
    try:
        with _quiet_ir_datasets():
            result = fn(*args)
            return list(result) if isinstance(result, Iterator) else result
    except InputError:
        raise
    except Exception as exc:
        raise _offline_error(ref, exc) from None


def scored_documents(ref: str, split: str) -> Iterator[tuple[str, str, float]]:
    """(query id, doc id, score) of the run an ir_datasets collection ships for ``split`` (its
    ``scoreddocs``: MS MARCO document's official top-100 for train and dev), streamed; one clear
    line where it has none, or cannot be downloaded."""
    import ir_datasets

    base = ref.strip("/")
    try:
        dataset = ir_datasets.load(base)
        subset = dataset if dataset.has_qrels() else ir_datasets.load(f"{base}/{split}")
    except KeyError:
        raise InputError(ref, f"first_stage scoreddocs: no ir_datasets split '{split}' (scoreddocs needs an ir_datasets "
                              "collection)") from None
    if not subset.has_scoreddocs():
        raise InputError(ref, f"first_stage scoreddocs: split '{split}' ships no run (no scoreddocs); use bm25")
    for scored in _guarded_iter(ref, subset.scoreddocs_iter):
        yield scored.query_id, scored.doc_id, float(scored.score)


def load_ir_datasets(ref: str) -> Collection:
    """Load an ir_datasets id; for ids without qrels, their train/dev/test subsets become splits."""
    try:
        import ir_datasets
    except ImportError:
        raise InputError(f"ir_datasets:{ref}", "the ir_datasets package is not installed") from None
    try:
        dataset = ir_datasets.load(ref)
    except KeyError:
        raise InputError(ref, "unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, not an ir_datasets id") from None
    subsets: dict[str, object] = {}
    if dataset.has_qrels():
        last = ref.rsplit("/", 1)[-1]
        subsets[last if last in _KNOWN_SPLITS else "test"] = dataset
    else:
        for split in _KNOWN_SPLITS:
            try:
                subsets[split] = ir_datasets.load(f"{ref}/{split}")
            except KeyError:
                continue
    if not subsets:
        raise InputError(f"ir_datasets:{ref}", "has no relevance judgements in any split")
    queries: dict[str, str] = {}
    qrels: dict[str, Qrels] = {}
    for split, subset in subsets.items():
        # materialised inside the guard: a download happens while iterating, not when asked
        for query in _irds_call(ref, subset.queries_iter):
            queries[query.query_id] = getattr(query, "text", None) or getattr(query, "title", "")
        split_qrels: Qrels = {}
        for qrel in _irds_call(ref, subset.qrels_iter):
            split_qrels.setdefault(qrel.query_id, {})[qrel.doc_id] = int(qrel.relevance)
        qrels[split] = split_qrels
    corpus = _IrdsDocs(dataset, ref) if dataset.has_docs() else None
    # The guess when nothing states it (see :mod:`workloads.data.resolve`): TREC-DL counts grades >= 2.
    relevance_level = 2 if "trec-dl" in ref else 1
    return Collection(name=ref, corpus=corpus, queries=queries, qrels=qrels, relevance_level=relevance_level)
