"""Selector inputs: a query and a document's sentences as token ids, batched.

A sentence is tokenized twice when the selector reads other tokens than the ranker
(GloVe words vs word pieces); with the ranker's own embeddings (the default) both are the
same word pieces. The document is one sequence of its sentences' tokens (the attention
selector runs one BiLSTM over it) with each token's sentence index, so token states can
be cut back into sentences. Caps (docs/guide/augmentation.md): at most ``max_sentences`` sentences,
``max_document_tokens`` document tokens (sentences past the budget are dropped, the last
one cut) and ``max_query_tokens`` query tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from workloads.text.tokens import tokenize


@dataclass(frozen=True)
class TokenizedText:
    """A query, or a document as sentences: selector ids and ranker ids per sentence."""

    selector_ids: tuple[tuple[int, ...], ...]
    ranker_ids: tuple[tuple[int, ...], ...]

    @property
    def sentences(self) -> int:
        return len(self.selector_ids)


@dataclass
class SelectorBatch:
    """Padded tensors of a batch of (query, document) pairs."""

    query_ids: torch.Tensor        # [B, Lq] selector ids, 0-padded
    query_mask: torch.Tensor       # [B, Lq] bool
    document_ids: torch.Tensor     # [B, Ld] the sentences' selector ids, concatenated
    document_mask: torch.Tensor    # [B, Ld] bool
    token_sentence: torch.Tensor   # [B, Ld] long: the sentence of each token (padding: S, a slot that is dropped)
    sentence_mask: torch.Tensor    # [B, S] bool: real sentences
    queries: list[TokenizedText]   # for the ranker's input
    documents: list[TokenizedText]

    def to(self, device: torch.device) -> SelectorBatch:
        moved = {k: getattr(self, k).to(device) for k in
                 ("query_ids", "query_mask", "document_ids", "document_mask", "token_sentence", "sentence_mask")}
        return SelectorBatch(**moved, queries=self.queries, documents=self.documents)


class SentenceTokenizer:
    """Turns texts into :class:`TokenizedText` with the ranker's tokenizer and, for GloVe
    embeddings, a word -> row vocabulary (row 0: unknown words, a zero vector)."""

    def __init__(self, word_pieces: Callable[[list[str]], list[list[int]]], max_sentences: int, max_document_tokens: int,
                 max_query_tokens: int, glove_words: dict[str, int] | None = None):
        self.word_pieces = word_pieces
        self.max_sentences, self.max_document_tokens, self.max_query_tokens = max_sentences, max_document_tokens, max_query_tokens
        self.glove_words = glove_words
        self._documents: dict[str, TokenizedText] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer, spec, glove_words: dict[str, int] | None = None) -> SentenceTokenizer:
        def word_pieces(texts: list[str]) -> list[list[int]]:
            return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

        return cls(word_pieces, spec.max_sentences, spec.max_document_tokens, spec.max_query_tokens, glove_words)

    def _selector_ids(self, texts: list[str], pieces: list[list[int]]) -> list[list[int]]:
        if self.glove_words is None:
            return pieces
        return [[self.glove_words.get(w, 0) for w in tokenize(t)] or [0] for t in texts]

    def query(self, text: str) -> TokenizedText:
        pieces = self.word_pieces([text])[0][: self.max_query_tokens] or [0]
        selector = self._selector_ids([text], [pieces])[0][: self.max_query_tokens]
        return TokenizedText((tuple(selector),), (tuple(pieces),))

    def document(self, sentences: Sequence[str], key: str | None = None) -> TokenizedText:
        """A document's sentences within the caps (cached by ``key``, e.g. the document id)."""
        if key is not None and key in self._documents:
            return self._documents[key]
        sentences = list(sentences[: self.max_sentences])
        pieces = self.word_pieces(sentences)
        selector = self._selector_ids(sentences, pieces)
        kept_selector, kept_ranker, budget = [], [], self.max_document_tokens
        for sel, rank in zip(selector, pieces):
            if budget <= 0:
                break
            sel = sel[:budget] or [0]
            budget -= len(sel)
            kept_selector.append(tuple(sel))
            kept_ranker.append(tuple(rank))
        out = TokenizedText(tuple(kept_selector), tuple(kept_ranker))
        if key is not None:
            self._documents[key] = out
        return out


def collate(queries: Sequence[TokenizedText], documents: Sequence[TokenizedText]) -> SelectorBatch:
    """Pad a batch; a document without sentences has an all-False sentence mask."""
    batch = len(queries)
    query_tokens = [q.selector_ids[0] for q in queries]
    max_query = max(1, max(len(q) for q in query_tokens))
    max_sentences = max(1, max(d.sentences for d in documents))
    doc_tokens = [[t for s in d.selector_ids for t in s] for d in documents]
    max_doc = max(1, max(len(t) for t in doc_tokens))
    query_ids = torch.zeros(batch, max_query, dtype=torch.long)
    query_mask = torch.zeros(batch, max_query, dtype=torch.bool)
    document_ids = torch.zeros(batch, max_doc, dtype=torch.long)
    document_mask = torch.zeros(batch, max_doc, dtype=torch.bool)
    token_sentence = torch.full((batch, max_doc), max_sentences, dtype=torch.long)
    sentence_mask = torch.zeros(batch, max_sentences, dtype=torch.bool)
    for b, (q, d) in enumerate(zip(query_tokens, documents)):
        query_ids[b, : len(q)] = torch.tensor(q, dtype=torch.long)
        query_mask[b, : len(q)] = True
        position = 0
        for s, sentence in enumerate(d.selector_ids):
            end = position + len(sentence)
            document_ids[b, position:end] = torch.tensor(sentence, dtype=torch.long)
            token_sentence[b, position:end] = s
            position = end
        document_mask[b, :position] = True
        sentence_mask[b, : d.sentences] = True
    return SelectorBatch(query_ids, query_mask, document_ids, document_mask, token_sentence, sentence_mask,
                         list(queries), list(documents))


def per_sentence(values: torch.Tensor, token_sentence: torch.Tensor, sentences: int, reduce: str) -> torch.Tensor:
    """Reduce token values [B, L, D] into sentences [B, S, D] (``sum`` or ``amax``); padding
    tokens point at slot S, which is dropped. An empty sentence reduces to 0."""
    batch, _, dim = values.shape
    index = token_sentence.unsqueeze(-1).expand(-1, -1, dim)
    out = values.new_zeros(batch, sentences + 1, dim)
    out = out.scatter_reduce(1, index, values, reduce=reduce, include_self=False)
    return out[:, :sentences]
