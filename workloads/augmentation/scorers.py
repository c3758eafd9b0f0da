"""Sentence scorers of AUG section 5 / SCL22: score(q, s) for every sentence s of a document.

- ``random`` (SCL22 "sampling"): a random score per sentence from a seeded generator, so
  k_a random sentences are kept, in random order;
- ``bm25`` (AUG eq. 6): BM25(q, s) with the inverse document frequencies of the whole
  corpus (every document counts once) and sentence lengths normalised by the mean
  sentence length of the corpus;
- ``glove`` (AUG eq. 7): the dot product of the mean GloVe vectors of q and s. Words
  missing from the vocabulary are skipped; a text with no known word has no vector and its
  sentences score 0 (the scorer counts them in ``oov_texts``);
- ``linear`` and ``attention`` (AUG eq. 8-16, supervised): a trained selector
  (``workloads.selectors``) in eval mode; sentences past its caps score -inf (kept last).

``SCORERS`` is the registry: a new scorer is one class with ``name`` and ``build`` plus one
entry; ``AugmentationSpec.method`` and the sweep grid's available methods read it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from workloads.errors import InputError
from workloads.text.glove import load_glove, resolve_glove_path
from workloads.text.tokens import tokenize


class SentenceScorer(Protocol):
    name: str
    supervised: bool  # scores with a trained selector (``workloads.selectors``), trained first

    @classmethod
    def build(cls, spec, sentences: dict[str, list[str]], selector: Path | None = None) -> SentenceScorer:
        """The scorer for an ``AugmentationSpec``, given every document's sentences (and, for a
        supervised method, the trained selector's directory)."""

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]: ...


class RandomScorer:
    name = "random"
    supervised = False

    @classmethod
    def build(cls, spec, sentences: dict[str, list[str]], selector: Path | None = None) -> RandomScorer:
        return cls()

    def scores(self, query: str, sentences: list[str], rng: random.Random) -> list[float]:
        return [rng.random() for _ in sentences]


class BM25SentenceScorer:
    name = "bm25"
    supervised = False

    def __init__(self, documents: Iterable[list[str]], k1: float = 0.9, b: float = 0.4):
        """``documents``: each document of the corpus as its list of sentences."""
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
        if n_docs == 0:
            raise InputError("bm25 augmenter", "empty corpus: no IDF to compute")
        # Lucene's BM25 IDF: log(1 + (N - df + 0.5) / (df + 0.5)), never negative.
        self.idf = {w: math.log(1 + (n_docs - df + 0.5) / (df + 0.5)) for w, df in document_frequency.items()}
        self.default_idf = math.log(1 + (n_docs + 0.5) / 0.5)
        self.mean_length = token_count / max(sentence_count, 1)
        self.k1, self.b = k1, b

    @classmethod
    def build(cls, spec, sentences: dict[str, list[str]], selector: Path | None = None) -> BM25SentenceScorer:
        return cls(sentences.values())

    def score(self, query_tokens: list[str], sentence: str) -> float:
        tokens = tokenize(sentence)
        tf = Counter(tokens)
        norm = self.k1 * (1 - self.b + self.b * len(tokens) / self.mean_length)
        return float(sum(self.idf.get(w, self.default_idf) * tf[w] * (self.k1 + 1) / (tf[w] + norm)
                         for w in set(query_tokens) if w in tf))

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
    def build(cls, spec, sentences: dict[str, list[str]], selector: Path | None = None) -> GloVeScorer:
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
    def build(cls, spec, sentences: dict[str, list[str]], selector: Path | None = None) -> SelectorScorer:
        if selector is None:
            raise ValueError(f"augmentation '{cls.name}' needs a trained selector")
        # imported here, not at the top: the spec imports this registry, and every command (even
        # `orchestrate --help`) would pay for transformers' import; this is no cycle (tests/test_layers.py)
        from workloads.selectors.select_and_rank import SelectAndRank

        model = SelectAndRank.load(selector)
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
