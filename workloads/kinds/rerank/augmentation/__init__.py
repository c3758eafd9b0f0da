"""Data augmentation (AUG Algorithm 1): lexical scorers and trained selectors.

For each training triple (q, d+, d-) a second triple (q, d+_a, d-_a) is made: d+_a is the
k_a highest-scoring sentences of d+ under score(q, s) (a lexical scorer or a trained
supervised selector), **ordered by score** (AUG eq. 5; ties keep the document's order),
and d-_a is a random non-relevant document: drawn uniformly from the corpus, excluding
the documents judged relevant for q (AUG's "random document"). Only training data is
augmented.

A document's candidate sentences are its title (one sentence of its own, when it has one:
for MS MARCO the title is often the best sentence) followed by its text's sentences. A row
whose document yields no sentence gets no augmented pair (``augmented_positive`` is null,
counted in the log and in the trial's data statistics): an empty text is never trained as
relevant.

AUG Algorithm 1 draws d-_a per batch. ``redraw: epoch`` (the default) draws d-_a, and the
``random`` scorer's sentences, anew for every epoch from a seeded generator, so each epoch
has its own file; ``redraw: once`` uses one draw for every epoch. Epoch 1's draw is the same
either way. Each file is computed once per (training set, method, k_a, seed, epoch) and
stored as Parquet, row-aligned with the training set.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Collection, sorted_document_ids
from workloads.data.parquet_rows import write_rows
from workloads.kinds.rerank.augmentation.scorers import BM25_SCORE_VERSION, SCORERS, SUPERVISED_METHODS, GloVeScorer, SentenceScorer
from workloads.text.glove import resolve_glove_path
from workloads.text.sentences import SPLITTER_VERSION, document_sentences

if TYPE_CHECKING:  # the spec imports the scorer registry: no import cycle at run time
    from workloads.kinds.rerank.augmentation.spec import AugmentationSpec

AUGMENTATION_SCHEMA = pa.schema([
    ("query_id", pa.string()), ("positive_id", pa.string()), ("augmented_positive", pa.string()),
    ("sentences_kept", pa.int32()), ("sentences_total", pa.int32()),
    ("augmented_negative_id", pa.string()), ("augmented_negative", pa.string()),
])


_log = get_logger("augment").info


def select_sentences(scores: list[float], sentences: list[str], k: int) -> list[str]:
    """The ``k`` highest-scoring sentences, by descending score (ties: document order)."""
    order = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    return [sentences[i] for i in order[:k]]


def build_scorer(spec: AugmentationSpec, collection: Collection, selector: Path | None = None) -> SentenceScorer:
    if spec.method not in SCORERS:
        raise ValueError(f"no scorer for augmentation method '{spec.method}' (known: {', '.join(SCORERS)})")
    return SCORERS[spec.method].build(spec, collection, selector=selector)


def augmentation_epochs(spec: AugmentationSpec, epochs: int) -> int:
    """How many distinct draws a trial of ``epochs`` epochs trains on."""
    return epochs if spec.redraw == "epoch" else 1


def _augmentation_path(training_set: Path, spec: AugmentationSpec, scorer_key, epoch: int) -> Path:
    # Epoch 1 keeps the key it had before per-epoch draws existed: the same file either way.
    key = stable_key(training_set.name, spec.method, spec.k, spec.seed, scorer_key, SPLITTER_VERSION,
                     *((f"epoch-{epoch}",) if epoch > 1 else ()))
    suffix = f"-e{epoch}" if epoch > 1 else ""
    return cache_dir() / "augmentations" / f"{training_set.stem}-{spec.method}-k{spec.k}{suffix}-{key}.parquet"


def build_augmentation_sets(collection: Collection, split: str, training_set: Path, spec: AugmentationSpec,
                            epochs: int = 1, selector: Path | None = None) -> list[Path]:
    """The augmentation file of every epoch (one file with ``redraw: once``); each is built
    once, then reused by every trial that asks for it. ``selector``: the trained selector of
    a supervised method (its directory name is its content key)."""
    scorer_key = None
    if spec.method == "bm25":
        scorer_key = f"score-v{BM25_SCORE_VERSION}"
    elif spec.method == "glove":
        glove = resolve_glove_path(spec.glove_path)
        scorer_key = (str(glove), glove.stat().st_size)
    elif spec.method in SUPERVISED_METHODS:
        if selector is None:
            raise ValueError(f"augmentation '{spec.method}' needs its trained selector")
        scorer_key = Path(selector).name
    paths = [_augmentation_path(training_set, spec, scorer_key, e) for e in range(1, augmentation_epochs(spec, epochs) + 1)]
    missing = [(e, p) for e, p in enumerate(paths, 1) if not p.exists()]
    for path in paths:
        if path.exists():
            _log(f"reusing {path}")
    if not missing:
        return paths
    rows = pq.read_table(training_set, columns=["query_id", "query", "positive_id"]).to_pylist()
    # each row's positive is split when it is augmented (looked up in the corpus's store): the
    # documents the training set uses, never the whole corpus, and never all of them held at once
    sentences = functools.lru_cache(maxsize=4096)(lambda doc_id: document_sentences(collection.document(doc_id)))
    scorer = build_scorer(spec, collection, selector)
    qrels = collection.split_qrels(split)
    doc_ids = sorted_document_ids(collection.require_corpus())
    for epoch, path in missing:
        started = time.perf_counter()
        out = (_augment_row(index, row, epoch, spec, sentences, scorer, qrels, collection, doc_ids)
               for index, row in enumerate(rows))
        with atomic_path(path, ".parquet") as tmp:  # written as it is made: the negatives' texts are whole documents
            written = write_rows(tmp, AUGMENTATION_SCHEMA, out)
        oov = f", {scorer.oov_texts} texts without a known GloVe word" if isinstance(scorer, GloVeScorer) else ""
        empty = rows_without_sentences(path)
        dropped = f", {empty} rows without any sentence (no augmented pair)" if empty else ""
        _log(f"{spec.method} k_a={spec.k} epoch {epoch}: {written} rows in {time.perf_counter() - started:.1f}s"
             f"{oov}{dropped} -> {path}")
    return paths


def rows_without_sentences(path: Path) -> int:
    """Rows of an augmentation file whose positive has no sentence (no augmented pair), from the
    Parquet statistics: nothing of the file's data is read."""
    metadata = pq.ParquetFile(path).metadata
    column = metadata.schema.names.index("augmented_positive")
    statistics = [metadata.row_group(g).column(column).statistics for g in range(metadata.num_row_groups)]
    if any(s is None or not s.has_null_count for s in statistics):  # a file written without them: read the column
        return pq.read_table(path, columns=["augmented_positive"]).column(0).null_count
    return sum(s.null_count for s in statistics)


def _augment_row(index: int, row: dict, epoch: int, spec: AugmentationSpec, sentences: Callable[[str], list[str]],
                 scorer: SentenceScorer, qrels, collection: Collection, doc_ids: Sequence[str]) -> dict:
    # One generator per row and epoch: a row's draw never depends on the others (epoch 1 keeps
    # the seed it had before per-epoch draws existed).
    epoch_part = f"-e{epoch}" if epoch > 1 else ""
    rng = random.Random(f"{spec.seed}{epoch_part}-{index}-{row['query_id']}-{row['positive_id']}")
    doc_sentences = sentences(row["positive_id"])
    kept = select_sentences(scorer.scores(row["query"], doc_sentences, rng), doc_sentences, spec.k)
    base = {"query_id": row["query_id"], "positive_id": row["positive_id"],
            "sentences_kept": len(kept), "sentences_total": len(doc_sentences)}
    if not kept:  # nothing to keep: no augmented pair for this row
        return {**base, "augmented_positive": None, "augmented_negative_id": None, "augmented_negative": None}
    relevant = {d for d, g in qrels.get(row["query_id"], {}).items() if g >= collection.relevance_level}
    negative_id = rng.choice(doc_ids)
    while negative_id in relevant or negative_id == row["positive_id"]:
        negative_id = rng.choice(doc_ids)
    return {**base, "augmented_positive": " ".join(kept), "augmented_negative_id": negative_id,
            "augmented_negative": collection.document(negative_id).contents}
