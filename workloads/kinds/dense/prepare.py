"""The dense trial's data, prepared on the driver and cached by content.

Supervised (DPR): the rows are the re-ranking kind's training set for the same data, first
stage, size and seed (:func:`workloads.kinds.rerank.steps.prepare_trial`): each row a query, a
judged-relevant document and its BM25 hard negative(s) drawn from the first stage's top
``train_depth`` (``negatives: in_batch`` reads the same rows without the negatives, so the two
objectives of a grid see the same queries). Validation re-scores the first stage's top
``validation_depth`` of the validation queries with the encoder: its cost grows with queries,
never with the corpus. BM25's test run (top 1000) is the baseline of the paired tests.

Unsupervised (SimCSE / DiffCSE sentence embeddings): ``training_data.size`` sentences of the
corpus (``sentences_per_document`` from each of a seeded draw of documents); validation and
the test baseline as above.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Qrels
from workloads.data.parquet_rows import write_rows
from workloads.data.resolve import resolve_collection
from workloads.evaluation import RETRIEVAL_MEASURES, Evaluation, evaluate
from workloads.kinds.dense.spec import DenseTrialSpec
from workloads.kinds.rerank.spec import OptimizationSpec, TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.retrieval.bm25 import read_trec_run
from workloads.spec import ModelSpec
from workloads.text.sentences import SPLITTER_VERSION, document_sentences

SENTENCES_SCHEMA = pa.schema([("doc_id", pa.string()), ("sentence", pa.string())])
MIN_SENTENCE_CHARACTERS = 20  # shorter "sentences" (numbers, headings) teach SimCSE nothing


@dataclass(frozen=True)
class DenseInputs:
    """What a worker reads."""

    training_rows: str          # supervised: the re-ranking training set (query, positive, negative...); else sentences
    unsupervised: bool
    validation_candidates: str  # the first stage's validation candidates (query, doc), re-scored every epoch
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int


@dataclass(frozen=True)
class PreparedDense:
    inputs: DenseInputs
    test_collection: str        # the collection reference the test corpus is searched in
    test_queries: dict[str, str]
    test_qrels: Qrels
    test_relevance_level: int
    first_stage_validation: dict[str, float]
    first_stage_test: Evaluation  # BM25 on the test queries (retrieval measures, top 1000)
    test_first_stage_run: str
    data_stats: dict[str, int]


def corpus_sentences(spec: DenseTrialSpec) -> tuple[str, int]:
    """``training_data.size`` sentences of the training collection's corpus (cached), and how many."""
    collection = resolve_collection(spec.data.collection)
    size, per_document = int(spec.training_data.size), spec.dense.sentences_per_document
    key = stable_key(collection.fingerprint, size, spec.training_data.seed, per_document, MIN_SENTENCE_CHARACTERS,
                     f"sentences-v{SPLITTER_VERSION}")
    path = cache_dir() / "dense-data" / f"sentences-{key}.parquet"
    if path.exists():
        return str(path), pq.read_metadata(path).num_rows
    corpus = collection.require_corpus()
    order = sorted(corpus)
    random.Random(spec.training_data.seed).shuffle(order)
    rows: list[dict[str, str]] = []
    for doc_id in order:  # documents in a seeded order until the set is full: the first documents' sentences only
        kept = [s for s in document_sentences(corpus[doc_id]) if len(s) >= MIN_SENTENCE_CHARACTERS][:per_document]
        rows.extend({"doc_id": doc_id, "sentence": s} for s in kept[:size - len(rows)])
        if len(rows) >= size:
            break
    with atomic_path(path, ".parquet") as tmp:
        write_rows(tmp, SENTENCES_SCHEMA, iter(rows))
    return str(path), len(rows)


def _rerank_trial(spec: DenseTrialSpec):
    """The plain re-ranking trial with the same data and first stage: its preparation is the dense trial's."""
    return TrialSpec(name=spec.name, seed=spec.seed, data=spec.data, first_stage=spec.first_stage,
                     training_data=spec.training_data,
                     model=ModelSpec(name=spec.model.name, max_length=spec.model.max_length),
                     optimization=OptimizationSpec(precision=spec.precision, eval_batch_size=spec.dense.eval_batch_size),
                     resources=spec.resources)


def prepare_dense(spec: DenseTrialSpec) -> PreparedDense:
    """The rows, the validation candidates, BM25's test run and its evaluation."""
    trial = prepare_trial(_rerank_trial(spec))  # cached by content; checks the model, the splits, their disjointness
    training = trial.training
    stats = dict(trial.data_stats)
    rows = training.training_set
    if spec.dense.unsupervised:
        rows, count = corpus_sentences(spec)
        stats = {k: v for k, v in stats.items() if not k.startswith("triples_")} | {"sentences": count}
    test_collection = resolve_collection(spec.data.test_collection or spec.data.collection)
    test_queries = test_collection.split_queries(spec.data.test_split)
    bm25_test = evaluate(read_trec_run(Path(trial.test_first_stage_run)), trial.test_qrels, trial.test_relevance_level,
                         RETRIEVAL_MEASURES)
    return PreparedDense(
        inputs=DenseInputs(rows, spec.dense.unsupervised, training.validation_candidates, training.validation_qrels,
                           training.relevance_level),
        test_collection=spec.data.test_collection or spec.data.collection, test_queries=test_queries,
        test_qrels=trial.test_qrels, test_relevance_level=trial.test_relevance_level,
        first_stage_validation=trial.first_stage_validation, first_stage_test=bm25_test,
        test_first_stage_run=trial.test_first_stage_run, data_stats=stats)


__all__ = ["DenseInputs", "PreparedDense", "corpus_sentences", "prepare_dense"]
