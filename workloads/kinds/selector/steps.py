"""The selector trial's steps on the driver: prepare (the plain re-ranking trial's data, cached by
content, and the sentences of every document a worker will see), test the chosen epoch on the
test candidates, install it in the cache. The workers' training (select-and-rank) and what they
read (:class:`~workloads.kinds.selector.train.SelectorInputs`) are
:mod:`workloads.kinds.selector.train`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.parquet_rows import write_rows
from workloads.data.resolve import resolve_collection
from workloads.evaluation.reranking import Reranking
from workloads.kinds.rerank.steps import PreparedTrial, prepare_trial
from workloads.kinds.selector.select_and_rank import SelectAndRank
from workloads.kinds.selector.spec import COMPLETE_MARKER, SelectorTrialSpec, selector_dir, selector_key
from workloads.kinds.selector.train import STATE_FILE, SelectorInputs, load_sentences, rerank_with_selector
from workloads.retrieval.bm25 import read_trec_run
from workloads.text.sentences import SPLITTER_VERSION, document_sentences
from workloads.training.loop import PROGRESS_FILE


@dataclass(frozen=True)
class PreparedSelector:
    inputs: SelectorInputs
    trial: PreparedTrial  # the same data as the plain re-ranking trial (test candidates, BM25 baselines)

    # what the orchestrator tracks of any kind's prepared data: the plain trial's
    @property
    def data_stats(self) -> dict[str, int]:
        return self.trial.data_stats

    @property
    def first_stage_validation(self) -> dict[str, float]:
        return self.trial.first_stage_validation

    @property
    def first_stage_test(self):
        return self.trial.first_stage_test

    @property
    def test_first_stage_run(self) -> str:
        return self.trial.test_first_stage_run


SENTENCES_SCHEMA = pa.schema([("doc_id", pa.string()), ("sentences", pa.list_(pa.string()))])


def _sentence_file(collection, paths: list[str]) -> str:
    """The candidate sentences of every document in these Parquet files (training set or
    candidates), cached: workers load these, not the whole corpus's."""
    path = cache_dir() / "selector-sentences" / f"{stable_key(*[Path(p).name for p in paths], SPLITTER_VERSION)}.parquet"
    if not path.exists():
        needed: set[str] = set()
        for file in paths:  # the id columns only: the texts are the corpus's, looked up per document
            columns = [c for c in ("positive_id", "negative_id", "doc_id") if c in pq.read_schema(file).names]
            for column in pq.read_table(file, columns=columns).columns:
                needed.update(column.to_pylist())
        rows = ({"doc_id": d, "sentences": document_sentences(collection.document(d))} for d in sorted(needed))
        with atomic_path(path, ".parquet") as tmp:
            write_rows(tmp, SENTENCES_SCHEMA, rows)
    return str(path)


def prepare_selector(spec: SelectorTrialSpec) -> PreparedSelector:
    """The selector's data: the plain trial's (cached by content), plus the documents' sentences."""
    trial = prepare_trial(spec.as_rerank_trial())
    training = trial.training
    files = [training.training_set, training.validation_candidates]
    sentences = _sentence_file(resolve_collection(spec.data.collection), files)
    return PreparedSelector(SelectorInputs(training.training_set, training.validation_candidates,
                                           training.validation_first_stage_run, training.validation_qrels,
                                           training.relevance_level, sentences), trial)


def evaluate_selector_checkpoint(checkpoint: Path, prepared: PreparedSelector, spec: SelectorTrialSpec,
                                 device: torch.device | None = None) -> Reranking:
    """The select-and-rank model of ``checkpoint`` on the test candidates: its held-out ranking quality."""
    trial = prepared.trial
    model = SelectAndRank.load(checkpoint, spec.model.max_length).to(device or torch.device("cpu"))
    collection = resolve_collection(spec.data.test_collection or spec.data.collection)
    sentences = load_sentences(_sentence_file(collection, [trial.test_candidates]))
    return rerank_with_selector(model, Path(trial.test_candidates), read_trec_run(Path(trial.test_first_stage_run)),
                                trial.test_qrels, trial.test_relevance_level, sentences, spec.selector.eval_batch_size,
                                "test selector")


def install_selector(spec: SelectorTrialSpec, checkpoint: Path, summary: dict, device=None) -> Path:
    """Copy the chosen checkpoint to the selector cache (atomically; the result file last)."""
    final = selector_dir(spec)
    with atomic_path(final) as tmp:
        shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(STATE_FILE, PROGRESS_FILE))
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"key": selector_key(spec), "spec": spec.model_dump(mode="json"),
                                                        **summary}, indent=1, sort_keys=True))
    get_logger("selector").info(f"selector {spec.name} -> {final}")
    return final


__all__ = ["PreparedSelector", "prepare_selector", "evaluate_selector_checkpoint", "install_selector"]
