"""Pairs tokenized once per (pairs, tokenizer, max_length), kept as Arrow and shared.

A trial used to tokenize its training pairs every epoch and its validation candidates at
every validation, and every winner tokenized the same test candidates again. Now each
set of (query, document) pairs is tokenized once, by the same tokenizer call as on the fly
(``truncation="longest_first"``, the trial's ``max_length``, no padding), and written as an
Arrow IPC file in the cache, keyed by the pairs' content, the tokenizer (its vocabulary and
rules) and ``max_length``: every trial and every evaluation that reads the same pairs with
the same tokenizer maps the same file (memory-mapped) instead. Batches are padded from the
stored ids by the tokenizer's own ``pad``, so a batch's tensors are exactly those of
tokenizing it on the fly (tested).

Pairs that are not in the stored set (augmented pairs, drawn per epoch) are tokenized on
the fly, in the same call. Only fast (Rust) tokenizers have a fingerprint here; a slow one
tokenizes on the fly as before.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from collections.abc import Sequence

import pyarrow as pa
import torch
from transformers import PreTrainedTokenizerBase

from workloads.logs import get_logger
from workloads.paths import atomic_path, cache_dir, exclusive, stable_key

TOKENIZED_DIR = "tokenized"
TOKENIZE_CHUNK = 4096  # pairs tokenized and written at a time
STORED_COLUMNS = {"input_ids": pa.int32(), "token_type_ids": pa.int8()}  # the mask is all ones: not stored
# the tokenizer's runtime settings, not its rules: set by every call with truncation/padding
_RUNTIME_KEYS = ("truncation", "padding")


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per tokenizer object: every epoch asks


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """A content key of a fast tokenizer's rules (vocabulary, normalizer, pre-tokenizer,
    post-processor and special tokens); None for a slow tokenizer."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    if tokenizer not in _FINGERPRINTS:
        _FINGERPRINTS[tokenizer] = _fingerprint(tokenizer)
    return _FINGERPRINTS[tokenizer]


def _fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    rules = json.loads(tokenizer.backend_tokenizer.to_str())
    for key in _RUNTIME_KEYS:
        rules.pop(key, None)
    digest = hashlib.sha256(json.dumps(rules, sort_keys=True).encode()).hexdigest()
    return stable_key(type(tokenizer).__name__, digest, tokenizer.padding_side, tokenizer.truncation_side)


def pairs_digest(queries: Sequence[str], documents: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for query, document in zip(queries, documents, strict=True):
        digest.update(query.encode())
        digest.update(b"\x00")
        digest.update(document.encode())
        digest.update(b"\x01")
    return digest.hexdigest()


_WORD = re.compile(r"\S+")


def cut_document(text: str, max_length: int) -> str:
    """The part of a document a pair of ``max_length`` tokens can use, cut before tokenizing: the
    tokenizer's memory grows with the whole text (MS MARCO documents run to tens of thousands of
    tokens) though truncation keeps at most ``max_length``. The cut falls on whitespace after
    2 * max_length + 16 words, and every word gives at least one token, so the tokens a pair
    keeps are those of the whole document (tested). Texts of fewer words stay whole. Written
    here because tokenizers truncate only after tokenizing the whole text. A word that gives no
    token (a zero-width space) is caught by :func:`cut_documents`, which tokenizers use."""
    limit = 2 * max_length + 16
    if len(text) <= limit:  # fewer characters than words the cut keeps: nothing to cut
        return text
    for index, word in enumerate(_WORD.finditer(text)):
        if index == limit:
            return text[:word.start()].rstrip()
    return text


def cut_documents(tokenizer: PreTrainedTokenizerBase, documents: Sequence[str], max_length: int) -> list[str]:
    """Each document cut by :func:`cut_document`, kept whole where its cut part gives fewer than
    ``max_length`` tokens: a word can give none (a zero-width space, a mark the normalizer
    strips), and only a cut part of ``max_length`` tokens or more truncates as the whole does."""
    cut = [cut_document(document, max_length) for document in documents]
    shortened = [i for i, (part, whole) in enumerate(zip(cut, documents)) if part is not whole]
    if shortened:
        counts = tokenizer([cut[i] for i in shortened], add_special_tokens=False)["input_ids"]
        for i, ids in zip(shortened, counts):
            if len(ids) < max_length:
                cut[i] = documents[i]
    return cut


def tokenize_pairs(tokenizer: PreTrainedTokenizerBase, queries: Sequence[str], documents: Sequence[str],
                   max_length: int) -> dict[str, list[list[int]]]:
    """Token ids (and attention masks) of each pair, unpadded: the one tokenizer call of both
    paths (the document is cut, :func:`cut_documents`, then truncated first, see ``CrossEncoder.encode``)."""
    documents = cut_documents(tokenizer, documents, max_length)
    encoded = tokenizer(list(queries), documents, truncation="longest_first", max_length=max_length)
    return {key: encoded[key] for key in (*STORED_COLUMNS, "attention_mask") if key in encoded}


class TokenizedPairs:
    """The stored token ids of a set of pairs, looked up by (query, document)."""

    def __init__(self, table: pa.Table, queries: Sequence[str], documents: Sequence[str]) -> None:
        self.table = table
        self.columns = {name: table.column(name) for name in table.column_names}
        self.row_of = {(q, d): i for i, (q, d) in enumerate(zip(queries, documents))}

    def __len__(self) -> int:
        return self.table.num_rows

    def features(self, queries: Sequence[str], documents: Sequence[str]) -> list[dict[str, list[int]] | None]:
        """Per pair, its ids with an all-ones attention mask (what ``tokenizer.pad`` takes),
        or None for a pair that is not stored."""
        out: list[dict[str, list[int]] | None] = []
        for pair in zip(queries, documents):
            row = self.row_of.get(pair)
            if row is None:
                out.append(None)
                continue
            feature = {name: column[row].as_py() for name, column in self.columns.items()}
            feature["attention_mask"] = [1] * len(feature["input_ids"])
            out.append(feature)
        return out


def tokenized_pairs(queries: Sequence[str], documents: Sequence[str], tokenizer: PreTrainedTokenizerBase,
                    max_length: int) -> TokenizedPairs | None:
    """The pairs' token ids from the cache, tokenized and stored first if no trial did yet
    (concurrent trials wait for one another: built once). None for a slow tokenizer."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        return None
    path = cache_dir() / TOKENIZED_DIR / f"{stable_key(pairs_digest(queries, documents), fingerprint, max_length)}.arrow"
    if not path.exists():
        with exclusive(path):
            if not path.exists():  # another trial may have built it while this one waited
                with atomic_path(path, ".arrow") as tmp:
                    _write_tokenized(tmp, tokenizer, queries, documents, max_length)
                get_logger("tokenize").debug(f"tokenized {len(queries):,} pairs at {max_length} tokens: {path.name}")
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    return TokenizedPairs(table, queries, documents)


def _write_tokenized(path, tokenizer: PreTrainedTokenizerBase, queries: Sequence[str], documents: Sequence[str],
                     max_length: int) -> None:
    """Tokenize and write in chunks of :data:`TOKENIZE_CHUNK` pairs (record batches): the ids of one
    chunk are in memory at a time, not those of a whole validation set."""
    with pa.OSFile(str(path), "wb") as sink:
        writer = None
        for start in range(0, max(len(queries), 1), TOKENIZE_CHUNK):
            ids = tokenize_pairs(tokenizer, queries[start:start + TOKENIZE_CHUNK],
                                 documents[start:start + TOKENIZE_CHUNK], max_length)
            batch = pa.record_batch({name: pa.array(values, type=pa.list_(STORED_COLUMNS[name]))
                                     for name, values in ids.items() if name in STORED_COLUMNS})
            if writer is None:
                writer = pa.ipc.new_file(sink, batch.schema)
            writer.write_batch(batch)
        writer.close()  # (an error leaves the file in atomic_path's temporary directory, removed)


def pad_features(tokenizer: PreTrainedTokenizerBase, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Pad stored pairs to the batch's longest, with the tokenizer's own rules (side, pad id,
    pad token type), as tokenizing the batch with ``padding="longest"`` does."""
    return dict(tokenizer.pad(features, padding="longest", return_tensors="pt"))


__all__ = ["TokenizedPairs", "tokenized_pairs", "tokenize_pairs", "cut_document", "cut_documents", "tokenizer_fingerprint",
           "pad_features", "pairs_digest"]
