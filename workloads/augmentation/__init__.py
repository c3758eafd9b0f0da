"""Unsupervised data augmentation (AUG Algorithm 1; METHODS section 5).

For each training triple (q, d+, d-) a second triple (q, d+_a, d-_a) is made: d+_a is the
k_a highest-scoring sentences of d+ under score(q, s), **ordered by score** (ties keep the
document's order), and d-_a is a random non-relevant document: drawn uniformly from the
corpus, excluding the documents judged relevant for q (AUG's "random document"). Only
training data is augmented. Augmentations are computed once per (training set, method,
k_a, seed) and stored as Parquet, row-aligned with the training set.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workloads.augmentation.scorers import BM25SentenceScorer, GloVeScorer, RandomScorer, SentenceScorer, load_glove
from workloads.augmentation.sentences import split_sentences
from workloads.collections import Collection
from workloads.errors import InputError
from workloads.paths import atomic_path, cache_dir, data_dir, stable_key
from workloads.spec import AugmentationSpec

SPLITTER_VERSION = 1

AUGMENTATION_SCHEMA = pa.schema([
    ("query_id", pa.string()), ("positive_id", pa.string()), ("augmented_positive", pa.string()),
    ("sentences_kept", pa.int32()), ("sentences_total", pa.int32()),
    ("augmented_negative_id", pa.string()), ("augmented_negative", pa.string()),
])


def _log(message: str) -> None:
    print(f"[augment] {message}", file=sys.stderr, flush=True)


def corpus_sentences(collection: Collection) -> dict[str, list[str]]:
    """Every document's text split into sentences, cached per collection content."""
    path = cache_dir() / "sentences" / f"{collection.fingerprint}-v{SPLITTER_VERSION}.parquet"
    if not path.exists():
        started = time.perf_counter()
        corpus = collection.require_corpus()
        table = pa.table({"doc_id": list(corpus), "sentences": [split_sentences(d.text) for d in corpus.values()]})
        with atomic_path(path, ".parquet") as tmp:
            pq.write_table(table, tmp)
        _log(f"split {len(corpus):,} documents into sentences in {time.perf_counter() - started:.1f}s -> {path}")
    table = pq.read_table(path).to_pydict()
    return dict(zip(table["doc_id"], table["sentences"]))


def select_sentences(scores: list[float], sentences: list[str], k: int) -> list[str]:
    """The ``k`` highest-scoring sentences, by descending score (ties: document order)."""
    order = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    return [sentences[i] for i in order[:k]]


def resolve_glove_path(glove_path: str) -> Path:
    path = Path(glove_path).expanduser()
    if not path.is_absolute() and not path.exists() and data_dir() is not None:
        path = data_dir() / path
    if not path.exists():
        raise InputError(glove_path, "GloVe file not found (relative paths resolve against $ORCHESTRATE_DATA_DIR)")
    return path


def build_scorer(spec: AugmentationSpec, sentences: dict[str, list[str]]) -> SentenceScorer:
    if spec.method == "random":
        return RandomScorer()
    if spec.method == "bm25":
        return BM25SentenceScorer(sentences.values())
    if spec.method == "glove":
        return GloVeScorer(*load_glove(resolve_glove_path(spec.glove_path)))
    raise ValueError(f"no scorer for augmentation method '{spec.method}'")


def build_augmentation_set(collection: Collection, split: str, training_set: Path, spec: AugmentationSpec) -> Path:
    """Augment every row of ``training_set``; built once, then reused by every trial."""
    glove_key = None
    if spec.method == "glove":
        glove = resolve_glove_path(spec.glove_path)
        glove_key = (str(glove), glove.stat().st_size)
    key = stable_key(training_set.name, spec.method, spec.k, spec.seed, glove_key, SPLITTER_VERSION)
    path = cache_dir() / "augmentations" / f"{training_set.stem}-{spec.method}-k{spec.k}-{key}.parquet"
    if path.exists():
        _log(f"reusing {path}")
        return path
    started = time.perf_counter()
    rows = pq.read_table(training_set).to_pylist()
    sentences = corpus_sentences(collection)
    scorer = build_scorer(spec, sentences)
    qrels = collection.split_qrels(split)
    doc_ids = sorted(collection.require_corpus())
    out = []
    for index, row in enumerate(rows):
        rng = random.Random(f"{spec.seed}-{index}-{row['query_id']}-{row['positive_id']}")
        doc_sentences = sentences[row["positive_id"]]
        kept = select_sentences(scorer.scores(row["query"], doc_sentences, rng), doc_sentences, spec.k)
        relevant = {d for d, g in qrels.get(row["query_id"], {}).items() if g >= collection.relevance_level}
        negative_id = rng.choice(doc_ids)
        while negative_id in relevant or negative_id == row["positive_id"]:
            negative_id = rng.choice(doc_ids)
        out.append({
            "query_id": row["query_id"], "positive_id": row["positive_id"], "augmented_positive": " ".join(kept),
            "sentences_kept": len(kept), "sentences_total": len(doc_sentences),
            "augmented_negative_id": negative_id, "augmented_negative": collection.document(negative_id).contents,
        })
    with atomic_path(path, ".parquet") as tmp:
        pq.write_table(pa.Table.from_pylist(out, schema=AUGMENTATION_SCHEMA), tmp)
    oov = f", {scorer.oov_texts} texts without a known GloVe word" if isinstance(scorer, GloVeScorer) else ""
    _log(f"{spec.method} k_a={spec.k}: {len(out)} rows in {time.perf_counter() - started:.1f}s{oov} -> {path}")
    return path
