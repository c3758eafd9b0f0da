"""Sentence scorers of AUG section 5 / SCL22: score(q, s) for every sentence s of a document.

- ``random`` (SCL22 "sampling"): a random score per sentence from a seeded generator, so
  k_a random sentences are kept, in random order;
- ``bm25`` (AUG eq. 6): BM25(q, s) with the inverse document frequencies of the whole
  corpus (every document counts once) and sentence lengths normalised by the mean
  sentence length of the corpus (:class:`SentenceStatistics`, one pass per collection);
- ``glove`` (AUG eq. 7): the dot product of the mean GloVe vectors of q and s. Words
  missing from the vocabulary are skipped; a text with no known word has no vector and its
  sentences score 0 (the scorer counts them in ``oov_texts``);
- ``linear`` and ``attention`` (AUG eq. 8-16, supervised): a trained selector
  (``workloads.kinds.selector``) in eval mode; sentences past its caps score -inf (kept last).

``SCORERS`` is the registry: a new scorer is one class with ``name`` and ``build`` plus one
entry; ``AugmentationSpec.method`` and the sweep grid's available methods read it.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa

from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, exclusive
from workloads.text.glove import load_glove, resolve_glove_path
from workloads.text.sentences import SPLITTER_VERSION, document_sentences
from workloads.text.tokens import tokenize


class SentenceScorer(Protocol):
    name: str
    supervised: bool  # scores with a trained selector (``workloads.kinds.selector``), trained first

    @classmethod
    def build(cls, spec, collection, selector: Path | None = None) -> SentenceScorer:
        """The scorer for an ``AugmentationSpec`` over ``collection`` (the corpus its statistics
        come from) and, for a supervised method, the trained selector's directory."""

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]: ...


class RandomScorer:
    name = "random"
    supervised = False

    @classmethod
    def build(cls, spec, collection, selector: Path | None = None) -> RandomScorer:
        return cls()

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]:
        return [rng.random() for _ in sentences]


class SentenceStatistics:
    """What the ``bm25`` scorer needs of a whole corpus: how many documents hold each word
    (every document once, over its candidate sentences), and its counts of documents,
    sentences and tokens. Computed in one pass over the corpus and stored once per collection
    (:func:`corpus_sentence_statistics`): every (size, method, k_a) reuses it. Frequencies are
    looked up in a memory-mapped sorted word column, not a dictionary of the vocabulary (MS
    MARCO's has millions of words), and remembered per word asked."""

    def __init__(self, documents: int, sentences: int, tokens: int, words: pa.Array, frequencies: pa.Array):
        self.documents, self.sentences, self.tokens = documents, sentences, tokens
        self._words, self._frequencies = words, frequencies
        self._asked: dict[str, int] = {}

    @classmethod
    def of(cls, documents: Iterable[list[str]]) -> SentenceStatistics:
        """The statistics of ``documents``, each its list of candidate sentences."""
        document_frequency: Counter[str] = Counter()
        n_docs = sentence_count = token_count = 0
        for sentences in documents:
            n_docs += 1
            words: set[str] = set()
            for sentence in sentences:
                tokens = tokenize(sentence)
                words.update(tokens)
                sentence_count += 1
                token_count += len(tokens)
            document_frequency.update(words)
        ordered = sorted(document_frequency)
        return cls(n_docs, sentence_count, token_count, pa.array(ordered, pa.string()),
                   pa.array([document_frequency[w] for w in ordered], pa.int64()))

    def document_frequency(self, word: str) -> int:
        if word not in self._asked:
            # bisect over the sorted column (UTF-8 byte order is Python's string order)
            low, high = 0, len(self._words)
            while low < high:
                middle = (low + high) // 2
                if self._words[middle].as_py() < word:
                    low = middle + 1
                else:
                    high = middle
            found = low < len(self._words) and self._words[low].as_py() == word
            self._asked[word] = self._frequencies[low].as_py() if found else 0
        return self._asked[word]

    def save(self, path: Path) -> None:
        metadata = {"documents": str(self.documents), "sentences": str(self.sentences), "tokens": str(self.tokens)}
        batch = pa.record_batch({"word": self._words, "df": self._frequencies}).replace_schema_metadata(metadata)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)

    @classmethod
    def load(cls, path: Path) -> SentenceStatistics:
        batch = pa.ipc.open_file(pa.memory_map(str(path))).get_batch(0)  # saved as one batch: mapped, not copied
        meta = {k.decode(): int(v) for k, v in batch.schema.metadata.items()}
        return cls(meta["documents"], meta["sentences"], meta["tokens"], batch.column(0), batch.column(1))


def corpus_sentence_statistics(collection) -> SentenceStatistics:
    """The corpus's :class:`SentenceStatistics`, computed in one pass once per collection content
    and splitter version, then read from the cache."""
    path = cache_dir() / "sentence-statistics" / f"{collection.fingerprint}-v{SPLITTER_VERSION}.arrow"
    if not path.exists():
        with exclusive(path):
            if not path.exists():
                started = time.perf_counter()
                statistics = SentenceStatistics.of(document_sentences(d) for d in collection.require_corpus().values())
                if statistics.documents == 0:
                    raise InputError("bm25 augmenter", "empty corpus: no IDF to compute")
                with atomic_path(path, ".arrow") as tmp:
                    statistics.save(tmp)
                get_logger("augment").info(f"sentence statistics of {statistics.documents:,} documents of "
                                           f"{collection.name} in {time.perf_counter() - started:.1f}s -> {path}")
    return SentenceStatistics.load(path)


# In the key of the augmentation files the bm25 scorer chose: 2 since its scores are summed by math.fsum
BM25_SCORE_VERSION = 2


class BM25SentenceScorer:
    name = "bm25"
    supervised = False

    def __init__(self, statistics: SentenceStatistics, k1: float = 0.9, b: float = 0.4):
        if statistics.documents == 0:
            raise InputError("bm25 augmenter", "empty corpus: no IDF to compute")
        self.statistics = statistics
        self.n_docs = statistics.documents
        # Lucene's BM25 IDF: log(1 + (N - df + 0.5) / (df + 0.5)), never negative; a word no
        # document holds has df 0
        self.mean_length = statistics.tokens / max(statistics.sentences, 1)
        self.k1, self.b = k1, b

    def idf(self, word: str) -> float:
        df = self.statistics.document_frequency(word)
        return math.log(1 + (self.n_docs - df + 0.5) / (df + 0.5))

    @classmethod
    def build(cls, spec, collection, selector: Path | None = None) -> BM25SentenceScorer:
        return cls(corpus_sentence_statistics(collection))

    def score(self, query_tokens: list[str], sentence: str) -> float:
        tokens = tokenize(sentence)
        tf = Counter(tokens)
        norm = self.k1 * (1 - self.b + self.b * len(tokens) / self.mean_length)
        # math.fsum: the same score on every Python and in every order of the set (the built-in sum's
        # last digits depend on both), so sentences' ranking never does (BM25_SCORE_VERSION)
        return math.fsum(self.idf(w) * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in set(query_tokens) if w in tf)

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]:
        query_tokens = tokenize(query)
        return [self.score(query_tokens, s) for s in sentences]


class GloVeScorer:
    name = "glove"
    supervised = False

    def __init__(self, words: dict[str, int], vectors: np.ndarray):
        self.words, self.vectors = words, vectors
        self.oov_texts = 0

    @classmethod
    def build(cls, spec, collection, selector: Path | None = None) -> GloVeScorer:
        return cls(*load_glove(resolve_glove_path(spec.glove_path)))

    def mean_vector(self, text: str) -> np.ndarray | None:
        rows = [self.words[t] for t in tokenize(text) if t in self.words]
        if not rows:
            self.oov_texts += 1
            return None
        return self.vectors[rows].mean(axis=0)

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]:
        q = self.mean_vector(query)
        out = []
        for sentence in sentences:
            s = self.mean_vector(sentence)
            out.append(0.0 if q is None or s is None else float(q @ s))
        return out


class SelectorScorer:
    """A trained supervised selector (select-and-rank's, eval mode) scoring each sentence."""

    name = ""
    supervised = True

    def __init__(self, model):
        self.model = model

    @classmethod
    def build(cls, spec, collection, selector: Path | None = None) -> SelectorScorer:
        if selector is None:
            raise ValueError(f"augmentation '{cls.name}' needs a trained selector")
        # the selector kind's trained model (served through workloads.kinds.rerank.augmentation.supervised)
        from workloads.kinds.rerank.augmentation.supervised import trained_selectors  # noqa: PLC0415

        model = trained_selectors().load(selector)
        model.eval()
        return cls(model)

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]:
        return self.model.score_sentences(query, sentences) if sentences else []


class LinearSelectorScorer(SelectorScorer):
    name = "linear"


class AttentionSelectorScorer(SelectorScorer):
    name = "attention"


SCORERS: dict[str, type] = {RandomScorer.name: RandomScorer, BM25SentenceScorer.name: BM25SentenceScorer,
                            GloVeScorer.name: GloVeScorer, LinearSelectorScorer.name: LinearSelectorScorer,
                            AttentionSelectorScorer.name: AttentionSelectorScorer}
SUPERVISED_METHODS = tuple(name for name, scorer in SCORERS.items() if scorer.supervised)  # need a trained selector
