"""One typed notion of a test collection: corpus, queries, graded qrels, named splits.

A :class:`Collection` is opened from a reference by :func:`workloads.data.resolve.resolve_collection`
(local BEIR, TREC or WikiQA files, or an ir_datasets id); this module holds the type alone, so
every reader builds it and every consumer reads it without importing the readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from workloads.core.errors import InputError
from workloads.data.document import Document

Qrels = dict[str, dict[str, int]]  # query id -> doc id -> graded relevance


@dataclass
class Collection:
    """A corpus with queries and graded relevance judgements per named split.

    ``relevance_level`` is the minimum grade that counts as relevant for binary measures
    (AP, RR, P) and for picking training positives: 1 for BEIR, 2 for TREC-DL.
    """

    name: str
    corpus: Mapping[str, Document] | None
    queries: dict[str, str]
    qrels: dict[str, Qrels]
    relevance_level: int = 1
    # split -> query id -> doc id -> score: candidate lists that ship with the collection
    # (answer selection), in their given order (descending scores); ``first_stage: given``
    given: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    _fingerprint: str | None = field(default=None, repr=False)
    _fingerprint_of: Callable[[], str] | None = field(default=None, repr=False)  # how a reader computes it, when asked

    @property
    def splits(self) -> list[str]:
        return sorted(self.qrels)

    def split_qrels(self, split: str) -> Qrels:
        if split not in self.qrels:
            known = ", ".join(self.splits) or "none"
            raise InputError(self.name, f"no split '{split}' (splits: {known})")
        return self.qrels[split]

    def split_queries(self, split: str) -> dict[str, str]:
        """The queries judged in ``split``, in sorted id order."""
        judged = self.split_qrels(split)
        missing = [q for q in judged if q not in self.queries]
        if missing:
            raise InputError(self.name, f"split '{split}' judges {len(missing)} queries with no text (e.g. '{missing[0]}')")
        return {q: self.queries[q] for q in sorted(judged)}

    def given_candidates(self, split: str) -> dict[str, dict[str, float]]:
        """The candidate lists that come with ``split`` (``first_stage: given``)."""
        if split not in self.given:
            known = ", ".join(sorted(self.given)) or "none: this collection ships no candidate lists"
            raise InputError(self.name, f"no given candidates for split '{split}' (splits with candidates: {known}); "
                                        "use first_stage method bm25 or run")
        return self.given[split]

    def require_corpus(self) -> Mapping[str, Document]:
        if self.corpus is None:
            raise InputError(self.name, "has no corpus (topics and qrels only): give a corpus to index or re-rank")
        return self.corpus

    def document(self, doc_id: str) -> Document:
        try:
            return self.require_corpus()[doc_id]
        except KeyError:
            raise InputError(self.name, f"document '{doc_id}' is not in the corpus") from None

    @property
    def fingerprint(self) -> str:
        """What cache keys for indexes, runs and training sets hang on. A collection opened by
        :func:`~workloads.data.resolve.resolve_collection` carries its identity
        (:func:`~workloads.data.identity.collection_identity`: remembered per set of file sizes
        and times, or an ir_datasets id and version), so no process reads the corpus for it; one
        built in memory hashes its corpus's content, once."""
        if self._fingerprint is None and self._fingerprint_of is not None:
            self._fingerprint = self._fingerprint_of()
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for doc in self.require_corpus().values():
                digest.update(f"{doc.doc_id}\x1f{doc.title}\x1f{doc.text}\x1e".encode())
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint


def sorted_document_ids(corpus: Mapping[str, Document]) -> Sequence[str]:
    """Every document id of ``corpus`` in sorted order, without a list of them all where the corpus
    is a store (a local BEIR corpus, an ir_datasets docstore)."""
    return corpus.sorted_ids() if hasattr(corpus, "sorted_ids") else sorted(corpus)
