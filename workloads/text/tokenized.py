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

import numpy as np
import pyarrow as pa
import torch
from transformers import PreTrainedTokenizerBase

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, exclusive, stable_key

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

    def rows(self, queries: Sequence[str], documents: Sequence[str]) -> list[int | None]:
        """Per pair, its row in the table, or None for a pair that is not stored."""
        return [self.row_of.get(pair) for pair in zip(queries, documents)]

    def ids(self, rows: Sequence[int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per stored column, the ids of ``rows`` concatenated (int64) and each row's length:
        one Arrow ``take`` per column, no Python per pair or token."""
        indices = pa.array(rows, type=pa.int64())
        out = {}
        for name, column in self.columns.items():
            taken = column.take(indices).combine_chunks()
            out[name] = (taken.flatten().to_numpy(zero_copy_only=False).astype(np.int64),
                         taken.value_lengths().to_numpy(zero_copy_only=False).astype(np.int64))
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


def pad_features(tokenizer: PreTrainedTokenizerBase, features: list[dict[str, list[int]]],
                 length: int | None = None) -> dict[str, torch.Tensor]:
    """Pad pairs to the batch's longest (or to ``length``), with the tokenizer's own rules (side,
    pad id, pad token type), as tokenizing the batch with ``padding="longest"`` does. The
    reference :func:`pad_stored` is tested against, and its path for a tokenizer whose rules
    it does not cover; in the loop it cost 7-10 ms of Python per 16 x 512 batch on an H100 host,
    holding the GIL while the step waited (docs/performance.md)."""
    padding = {"padding": "max_length", "max_length": length} if length is not None else {"padding": "longest"}
    return dict(tokenizer.pad(features, return_tensors="pt", **padding))


def _numpy_padding_applies(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether :func:`pad_stored` knows every rule ``tokenizer.pad`` would apply: a pad token,
    a side, an attention mask among the model's inputs (else ``pad`` leaves it unpadded)."""
    return (tokenizer.pad_token_id is not None and tokenizer.padding_side in ("right", "left")
            and "attention_mask" in tokenizer.model_input_names)


def pad_stored(tokenizer: PreTrainedTokenizerBase, stored: TokenizedPairs, rows: Sequence[int | None],
               fresh: dict[str, list[list[int]]] | None = None, length: int | None = None) -> dict[str, torch.Tensor]:
    """The batch of ``rows`` (stored pairs) padded as :func:`pad_features` pads their features:
    the same keys in the same order, int64, the tokenizer's padding side, pad id and pad token
    type, the attention mask 1 on tokens and 0 on padding, to the longest pair (or ``length``).
    A row None takes the next pair of ``fresh`` (:func:`tokenize_pairs`' output for the pairs the
    store lacks, in order). Built with numpy from the Arrow ids: ~0.2 ms for 16 x 512 where
    ``tokenizer.pad`` took ~9 ms."""
    missing = sum(row is None for row in rows)
    if not _numpy_padding_applies(tokenizer):  # let the tokenizer pad (and say what it lacks)
        pieces = iter(range(missing))
        features = []
        for row in rows:
            if row is None:
                j = next(pieces)
                features.append({name: values[j] for name, values in fresh.items()})
            else:
                feature = {name: column[row].as_py() for name, column in stored.columns.items()}
                features.append(feature | {"attention_mask": [1] * len(feature["input_ids"])})
        return pad_features(tokenizer, features, length)
    names = list(stored.columns)
    if missing == 0:
        columns = stored.ids(list(rows))
        lengths = columns[names[0]][1]
        flat = {name: values for name, (values, _) in columns.items()}
    else:  # some pairs tokenized on the fly: each pair's ids in batch order
        kept = [row for row in rows if row is not None]
        columns = stored.ids(kept) if kept else {name: (np.zeros(0, np.int64), np.zeros(0, np.int64)) for name in names}
        split = {name: np.split(values, np.cumsum(counts)[:-1]) if len(counts) else [] for name, (values, counts) in columns.items()}
        stored_at, fresh_at = 0, 0
        per_pair: dict[str, list[np.ndarray]] = {name: [] for name in names}
        for row in rows:
            for name in names:
                per_pair[name].append(split[name][stored_at] if row is not None
                                      else np.asarray(fresh[name][fresh_at], dtype=np.int64))
            stored_at, fresh_at = stored_at + (row is not None), fresh_at + (row is None)
        lengths = np.array([len(ids) for ids in per_pair[names[0]]], dtype=np.int64)
        flat = {name: np.concatenate(per_pair[name]) if per_pair[name] else np.zeros(0, np.int64) for name in names}
    width = max(int(lengths.max(initial=0)), length or 0)
    positions = np.arange(width)
    if tokenizer.padding_side == "right":
        tokens = positions[None, :] < lengths[:, None]
    else:
        tokens = positions[None, :] >= (width - lengths)[:, None]
    pad_values = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
    out = {}
    for name in names:
        padded = np.full((len(lengths), width), pad_values.get(name, 0), dtype=np.int64)
        padded[tokens] = flat[name]  # row-major: each pair's ids in order, pairs in batch order
        out[name] = torch.from_numpy(padded)
    out["attention_mask"] = torch.from_numpy(tokens.astype(np.int64))
    return out


__all__ = ["TokenizedPairs", "tokenized_pairs", "tokenize_pairs", "cut_document", "cut_documents", "tokenizer_fingerprint",
           "pad_features", "pad_stored", "pairs_digest"]
