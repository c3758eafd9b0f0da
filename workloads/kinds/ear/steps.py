"""The EAR trial's steps on the driver: prepare, test and keep. The workers' training, what they
read (:class:`~workloads.kinds.ear.train.EarInputs`) and the choice of each query's expansion
are :mod:`workloads.kinds.ear.train`.

Prepare: every query of the train, validation and test splits gets its ``n`` expansions
(:mod:`workloads.kinds.ear.sources`), every expanded query ``q e_i`` is searched with BM25
(one Anserini call per split, top ``depth``), and each expansion's row records the query,
the expansion, the top-1 document it retrieves (d_i, what the RD reranker reads) and its
label r_i (the rank of the first relevant document, 0 when none is in the top ``depth``;
``max_rank`` replaces it at training time, so searching MAX_RANK prepares nothing again).
Each split's rankings are kept beside it: choosing an expansion is then a lookup, and
validation never searches. The unchosen systems of the test split (BM25, RM3, the first
expansion, all concatenated, the oracle) are evaluated once, for the comparison table.

Test: BM25 with each test query's expansion chosen by the chosen epoch's reranker. Keep: that
reranker and the run of its chosen expansions for every query of the trial's splits.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import torch

from workloads.core.errors import InputError
from workloads.core.logs import get_logger
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Collection, Qrels
from workloads.data.parquet_rows import write_rows
from workloads.data.resolve import resolve_collection
from workloads.evaluation import AGGREGATE_VERSION, RETRIEVAL_MEASURES, Evaluation, evaluate
from workloads.evaluation.ranking import TIE_ORDER, ranked_ids
from workloads.evaluation.reranking import Reranking
from workloads.kinds.ear.retrieval import SYSTEMS, best_rank, expansion_runs, unchosen_systems
from workloads.kinds.ear.sources import expansions, source_content
from workloads.kinds.ear.spec import COMPLETE_MARKER, RUN_FILE, EarTrialSpec, ear_dir, ear_key, trained_ear
from workloads.kinds.ear.train import STATE_FILE, EarInputs, Run, chosen_expansions, chosen_run, training_groups
from workloads.kinds.rerank.steps import _test_queries, _training_queries, require_disjoint
from workloads.models.cross_encoder import CrossEncoder, require_model_available
from workloads.retrieval.bm25 import BM25Params, read_trec_run, retrieved_run, write_trec_run
from workloads.text.sentences import SPLITTER_VERSION
from workloads.training.loop import PROGRESS_FILE

MODEL_DIR = "model"
DOCUMENT_CHARACTERS = 4_000  # d_i as the RD reranker reads it: the model truncates to max_length tokens anyway
ROLES = ("train", "validation", "test")
ROWS_SCHEMA = pa.schema([("query_id", pa.string()), ("query", pa.string()), ("expansion_index", pa.int32()),
                         ("expansion", pa.string()), ("top_document", pa.string()), ("rank", pa.int32())])
RANKINGS_SCHEMA = pa.schema([("query_id", pa.string()), ("expansion_index", pa.int32()), ("doc_id", pa.string()),
                             ("score", pa.float64())])


@dataclass(frozen=True)
class EarSplit:
    """One split's prepared files: a row per (query, expansion), and every expansion's ranking."""

    rows: str
    rankings: str


@dataclass(frozen=True)
class PreparedEar:
    inputs: EarInputs
    splits: dict[str, EarSplit]          # train, validation, test
    test_qrels: Qrels
    test_relevance_level: int
    systems: dict[str, Evaluation]       # the test split's unchosen systems (retrieval.SYSTEMS)
    first_stage_validation: dict[str, float]  # BM25 on the validation queries
    test_first_stage_run: str            # BM25's test run (top depth)
    data_stats: dict[str, int]

    @property
    def first_stage_test(self) -> Evaluation:
        return self.systems["bm25"]


# ----------------------------------------------------------------------------- prepare


def _split_files(collection: Collection, role: str, queries: dict[str, str], qrels: Qrels,
                 spec: EarTrialSpec) -> EarSplit:
    """The rows and rankings of one split, cached by content."""
    params = BM25Params(k1=spec.bm25.k1, b=spec.bm25.b)
    judged = sorted((q, sorted(d.items())) for q, d in qrels.items() if q in queries)
    key = stable_key(collection.fingerprint, role, sorted(queries.items()), judged, collection.relevance_level,
                     spec.expansion.model_dump_json(), source_content(spec.expansion), spec.bm25.model_dump_json(),
                     spec.ear.depth, f"sentences-v{SPLITTER_VERSION}", TIE_ORDER)
    directory = cache_dir() / "ear-data"
    rows_path, rankings_path = directory / f"{role}-{key}.rows.parquet", directory / f"{role}-{key}.rankings.parquet"
    if rows_path.exists() and rankings_path.exists():
        return EarSplit(str(rows_path), str(rankings_path))
    expanded = expansions(collection, queries, spec.expansion)
    runs = expansion_runs(collection, queries, expanded, spec.ear.depth, params)
    documents: dict[str, str] = {}

    def top_document(ranking: dict[str, float]) -> str:
        if not ranking:
            return ""
        doc_id = ranked_ids(ranking)[0]
        if doc_id not in documents:
            documents[doc_id] = collection.document(doc_id).contents[:DOCUMENT_CHARACTERS]
        return documents[doc_id]

    def rows():
        for qid, text in queries.items():
            for i, (expansion, ranking) in enumerate(zip(expanded[qid], runs[qid])):
                yield {"query_id": qid, "query": text, "expansion_index": i, "expansion": expansion,
                       "top_document": top_document(ranking),
                       "rank": best_rank(ranking, qrels.get(qid, {}), collection.relevance_level, 0)}

    def rankings():
        for qid in queries:
            for i, ranking in enumerate(runs[qid]):
                for doc_id, score in ranking.items():
                    yield {"query_id": qid, "expansion_index": i, "doc_id": doc_id, "score": score}

    with atomic_path(rankings_path, ".parquet") as tmp:
        write_rows(tmp, RANKINGS_SCHEMA, rankings())
    with atomic_path(rows_path, ".parquet") as tmp:  # last: its presence says the split is complete
        write_rows(tmp, ROWS_SCHEMA, rows())
    return EarSplit(str(rows_path), str(rankings_path))


def _systems(collection: Collection, queries: dict[str, str], qrels: Qrels, spec: EarTrialSpec) -> dict[str, Evaluation]:
    """The test split's unchosen systems, evaluated once and cached."""
    judged = sorted((q, sorted(d.items())) for q, d in qrels.items())
    key = stable_key(collection.fingerprint, sorted(queries.items()), judged, spec.expansion.model_dump_json(),
                     source_content(spec.expansion), spec.bm25.model_dump_json(), spec.ear.depth, RETRIEVAL_MEASURES,
                     f"sentences-v{SPLITTER_VERSION}", f"aggregate-v{AGGREGATE_VERSION}", TIE_ORDER)
    path = cache_dir() / "ear-data" / f"systems-{key}.json"
    if path.exists():
        return {name: Evaluation(**value) for name, value in json.loads(path.read_text()).items()}
    expanded = expansions(collection, queries, spec.expansion)
    runs = unchosen_systems(collection, queries, expanded, qrels, collection.relevance_level, spec.ear.depth,
                            BM25Params(k1=spec.bm25.k1, b=spec.bm25.b))
    out = {name: evaluate(runs[name], qrels, collection.relevance_level, RETRIEVAL_MEASURES) for name in SYSTEMS}
    with atomic_path(path, ".json") as tmp:
        tmp.write_text(json.dumps({name: asdict(value) for name, value in out.items()}))
    return out


def prepare_ear(spec: EarTrialSpec) -> PreparedEar:
    """Every split's expansions, labels and rankings, and the test split's unchosen systems."""
    require_model_available(spec.model.name)
    collection = resolve_collection(spec.data.collection)
    train_queries, train_ids, validation_queries, validation_qrels = _training_queries(spec, collection)
    test_collection, test_queries, test_qrels = _test_queries(spec, collection)
    require_disjoint(collection, {"train": train_ids, "validation": validation_queries,
                                  **({"test": test_queries} if test_collection is collection else {})})
    train_qrels = collection.split_qrels(spec.data.train_split)
    trained = {q: train_queries[q] for q in train_ids if q in train_qrels}  # a query without judgements has no labels
    log = get_logger("ear")
    splits = {}
    for role, where, queries, qrels in (("train", collection, trained, train_qrels),
                                        ("validation", collection, validation_queries, validation_qrels),
                                        ("test", test_collection, test_queries, test_qrels)):
        started = time.perf_counter()
        splits[role] = _split_files(where, role, queries, qrels, spec)
        log.info(f"{role}: {len(queries):,} queries x {spec.expansion.n} {spec.expansion.source} expansions, searched "
                 f"({time.perf_counter() - started:.0f}s)")
    learnable = len(training_groups(splits["train"].rows, spec.ear.max_rank))
    needed = spec.ear.queries_per_step * spec.resources.workers
    if learnable < needed:  # said now, in one line, not by a worker after the run is written
        raise InputError(spec.name, f"{learnable} training queries have expansions that BM25 ranks differently (a choice "
                                    f"to learn): a step needs {needed} (ear.queries_per_step x resources.workers)")
    params = BM25Params(k1=spec.bm25.k1, b=spec.bm25.b)
    validation_bm25 = retrieved_run(collection, validation_queries, k=spec.ear.depth, params=params)

    first_stage_validation = evaluate(read_trec_run(validation_bm25), validation_qrels, collection.relevance_level,
                                      RETRIEVAL_MEASURES).aggregate
    return PreparedEar(
        inputs=EarInputs(splits["train"].rows, splits["validation"].rows, splits["validation"].rankings, validation_qrels,
                         collection.relevance_level),
        splits=splits, test_qrels=test_qrels, test_relevance_level=test_collection.relevance_level,
        systems=_systems(test_collection, test_queries, test_qrels, spec),
        first_stage_validation=first_stage_validation,
        test_first_stage_run=str(retrieved_run(test_collection, test_queries, k=spec.ear.depth, params=params)),
        data_stats={"train_queries": len(trained), "validation_queries": len(validation_queries),
                    "test_queries": len(test_queries), "expansions_per_query": spec.expansion.n})

# ----------------------------------------------------------------------------- test and keep


def _load(checkpoint: Path, spec: EarTrialSpec, device: torch.device | None) -> CrossEncoder:
    return CrossEncoder.from_pretrained(str(checkpoint), spec.model.max_length).to(device or torch.device("cpu"))


def test_ear(checkpoint: Path, prepared: PreparedEar, spec: EarTrialSpec, chosen: dict, device=None) -> Reranking:
    """BM25 with each test query's chosen expansion: its retrieval quality on the test judgements."""
    model = _load(checkpoint, spec, device)
    picked = chosen_expansions(model, spec.ear.reranker, prepared.splits["test"].rows, spec.ear.eval_batch_size,
                               spec.precision, "test EAR", device)
    run = chosen_run(prepared.splits["test"].rankings, picked)
    return Reranking(evaluate(run, prepared.test_qrels, prepared.test_relevance_level, RETRIEVAL_MEASURES), run)


def kept_reranker(spec: EarTrialSpec, device: torch.device | None = None) -> CrossEncoder:
    """The query reranker a finished EAR trial kept."""
    kept = trained_ear(spec)
    if kept is None:
        raise InputError(spec.name, f"EAR trial not trained yet ({ear_dir(spec)}): `orchestrate run` trains it")
    return _load(kept / MODEL_DIR, spec, device)


def transferred_choice(spec: EarTrialSpec, collection: Collection, split: str, queries: dict[str, str], qrels: Qrels,
                       expansion, depth: int) -> Run:
    """The kept reranker of ``spec`` choosing among ``expansion`` (an ExpansionSpec) of another
    split's or collection's queries, untrained there (zero-shot): its chosen expansions' runs."""
    ear = spec.ear.model_copy(update={"depth": depth, "max_rank": max(spec.ear.max_rank, depth + 1)})
    # BM25 at its defaults, as every other row of the comparison searches
    here = spec.model_copy(update={"expansion": expansion, "ear": ear, "bm25": type(spec.bm25)()})
    files = _split_files(collection, f"transfer-{split}", queries, qrels, here)
    picked = chosen_expansions(kept_reranker(spec), spec.ear.reranker, files.rows, spec.ear.eval_batch_size,
                               spec.precision, f"EAR-{spec.ear.reranker.upper()} ({spec.name}) on {collection.name} {split}")
    return chosen_run(files.rankings, picked)


def keep_ear(spec: EarTrialSpec, checkpoint: Path, summary: dict, device: torch.device | None = None) -> Path:
    """Keep the chosen reranker and the run of its chosen expansions for every query of the
    trial's splits (what a re-ranking trial with ``first_stage: {method: ear}`` reads), the
    result file last."""
    prepared = prepare_ear(spec)  # cached: read back, nothing computed again
    model = _load(checkpoint, spec, device)
    run: Run = {}
    for role in ROLES:
        picked = chosen_expansions(model, spec.ear.reranker, prepared.splits[role].rows, spec.ear.eval_batch_size,
                                   spec.precision, f"EAR run, {role}", device)
        run.update(chosen_run(prepared.splits[role].rankings, picked))
    final = ear_dir(spec)
    with atomic_path(final) as tmp:
        tmp.mkdir(parents=True)
        shutil.copytree(checkpoint, tmp / MODEL_DIR, ignore=shutil.ignore_patterns(STATE_FILE, PROGRESS_FILE))
        write_trec_run(run, tmp / RUN_FILE, f"ear-{spec.ear.reranker}")
        (tmp / COMPLETE_MARKER).write_text(json.dumps({"key": ear_key(spec), "spec": spec.model_dump(mode="json"),
                                                        **summary}, indent=1, sort_keys=True))
    get_logger("ear").info(f"EAR trial {spec.name} -> {final}")
    return final

__all__ = ["EarSplit", "PreparedEar", "keep_ear", "kept_reranker", "prepare_ear", "test_ear", "transferred_choice"]
