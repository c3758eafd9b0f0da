"""The dense trial's steps on the driver: prepare (its data, cached by content), test and keep.
The workers' training, and what they read (:class:`~workloads.kinds.dense.train.DenseInputs`),
are :mod:`workloads.kinds.dense.train`.

Prepare. Supervised (DPR): the rows are the re-ranking kind's training set for the same data, first
stage, size and seed (:func:`workloads.kinds.rerank.steps.prepare_trial`): each row a query, a
judged-relevant document and its BM25 hard negative(s) drawn from the first stage's top
``train_depth`` (``negatives: in_batch`` reads the same rows without the negatives, so the two
objectives of a grid see the same queries). Validation re-scores the first stage's top
``validation_depth`` of the validation queries with the encoder: its cost grows with queries,
never with the corpus. BM25's test run (top 1000) is the baseline of the paired tests.

Unsupervised (SimCSE / DiffCSE sentence embeddings): ``training_data.size`` sentences of the
corpus (``sentences_per_document`` from each of a seeded draw of documents); validation and
the test baseline as above.

Test: the chosen epoch's encoder embeds the whole test corpus (a store keyed by the encoder's
and the corpus's content, :func:`workloads.kinds.dense.store.corpus_store`) and every test
query; exact inner-product search (faiss flat, :func:`workloads.kinds.dense.index.search_store`)
ranks the top :data:`TEST_DEPTH` per query, measured with the retrieval measures (nDCG@10,
R@100, ...). This is the dense run the trial reports and that the paired tests compare with
BM25's test run (:attr:`PreparedDense.first_stage_test`) on the same queries.

Keep: the chosen encoder (without the training-time pooler and the discriminator) in
``<cache>/dense/<objective>-<key>/model``, the result file last: what a dense first stage loads.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Qrels
from workloads.data.parquet_rows import write_rows
from workloads.data.resolve import resolve_collection
from workloads.evaluation import RETRIEVAL_MEASURES, Evaluation, evaluate
from workloads.evaluation.reranking import Reranking
from workloads.kinds.dense.index import search_store
from workloads.kinds.dense.spec import COMPLETE_MARKER, MODEL_DIR, DenseTrialSpec, dense_dir, dense_key
from workloads.kinds.dense.store import corpus_store
from workloads.kinds.dense.train import DenseInputs, load_encoder
from workloads.kinds.rerank.spec import OptimizationSpec, TrialSpec
from workloads.kinds.rerank.steps import prepare_trial
from workloads.retrieval.bm25 import read_trec_run
from workloads.spec import ModelSpec
from workloads.text.sentences import SPLITTER_VERSION, document_sentences

SENTENCES_SCHEMA = pa.schema([("doc_id", pa.string()), ("sentence", pa.string())])
MIN_SENTENCE_CHARACTERS = 20  # shorter "sentences" (numbers, headings) teach SimCSE nothing


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


TEST_DEPTH = 1000  # as BM25's baseline run: R@100 and the paired tests read the same depth on both sides

Run = dict[str, dict[str, float]]


def dense_run(checkpoint: Path, spec: DenseTrialSpec, collection_ref: str, queries: dict[str, str], depth: int = TEST_DEPTH,
              device: torch.device | None = None) -> Run:
    """The top ``depth`` documents of ``collection_ref``'s corpus for each query, by exact search."""
    device = device or torch.device("cpu")
    encoder = load_encoder(str(Path(checkpoint) / MODEL_DIR), spec).to(device)
    collection = resolve_collection(collection_ref)
    precision = spec.precision if spec.precision != "auto" else "fp32"  # the store's key names its precision
    store = corpus_store(encoder, collection, precision, batch_size=spec.dense.eval_batch_size, device=device)
    query_ids = list(queries)
    embedded = encoder.encode_queries([queries[q] for q in query_ids], batch_size=spec.dense.eval_batch_size,
                                      device=device, precision=precision)
    return search_store(store, query_ids, embedded, depth, method="flat")


def test_dense(checkpoint: Path, prepared: PreparedDense, spec: DenseTrialSpec, chosen: dict, device=None) -> Reranking:
    """The chosen encoder's retrieval on the test queries: exact search over the test corpus."""
    run = dense_run(checkpoint, spec, prepared.test_collection, prepared.test_queries, device=device)
    return Reranking(evaluate(run, prepared.test_qrels, prepared.test_relevance_level, RETRIEVAL_MEASURES), run)


test_dense.__test__ = False  # a trial step, not a pytest test


def keep_dense(spec: DenseTrialSpec, checkpoint: Path, summary: dict, device=None) -> Path:
    """Keep the chosen encoder, the result file last."""
    final = dense_dir(spec)
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        shutil.copytree(Path(checkpoint) / MODEL_DIR, tmp / MODEL_DIR)
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"key": dense_key(spec), "spec": spec.model_dump(mode="json"),
                                                        **summary}, indent=1, sort_keys=True))
    get_logger("dense").info(f"dense trial {spec.name} -> {final}")
    return final


__all__ = ["TEST_DEPTH", "PreparedDense", "corpus_sentences", "dense_run", "keep_dense", "prepare_dense", "test_dense"]
