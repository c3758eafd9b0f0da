"""The EAR trial's steps: prepare (driver), train (each worker), test, keep.

Prepare: every query of the train, validation and test splits gets its ``n`` expansions
(:mod:`workloads.kinds.ear.sources`), every expanded query ``q e_i`` is searched with BM25
(one Anserini call per split, top ``depth``), and each expansion's row records the query,
the expansion, the top-1 document it retrieves (d_i, what the RD reranker reads) and its
label r_i (the rank of the first relevant document, 0 when none is in the top ``depth``;
``max_rank`` replaces it at training time, so searching MAX_RANK prepares nothing again).
Each split's rankings are kept beside it: choosing an expansion is then a lookup, and
validation never searches. The unchosen systems of the test split (BM25, RM3, the first
expansion, all concatenated, the oracle) are evaluated once, for the comparison table.

Train: a cross-encoder M scores every (q, e_i) (RI) or (q e_i, d_i) (RD) of a step's
queries; M estimates the rank (lower is better), trained with EAR's pairwise margin loss
(:func:`workloads.kinds.ear.loss.ear_loss`). Each epoch is validated by the retrieval quality
of the chosen expansions (validation nDCG@10 chooses the epoch, as for every kind).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import get_constant_schedule_with_warmup

from workloads.core.errors import InputError
from workloads.core.logs import get_logger, progress_bar
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Collection, Qrels
from workloads.data.parquet_rows import write_rows
from workloads.data.resolve import resolve_collection
from workloads.evaluation import RETRIEVAL_MEASURES, Evaluation, evaluate, validation_values
from workloads.evaluation.reranking import Reranking
from workloads.kinds.ear.loss import ear_loss
from workloads.kinds.ear.retrieval import SYSTEMS, best_rank, expansion_runs, unchosen_systems
from workloads.kinds.ear.sources import expansions, source_content
from workloads.kinds.ear.spec import COMPLETE_MARKER, RUN_FILE, EarTrialSpec, ear_dir, ear_key, trained_ear
from workloads.kinds.rerank.steps import _test_queries, _training_queries, require_disjoint
from workloads.models.cross_encoder import CrossEncoder, autocast_dtype, require_model_available, score_pairs
from workloads.retrieval.bm25 import BM25Params, read_trec_run, retrieved_run, write_trec_run
from workloads.text.sentences import SPLITTER_VERSION
from workloads.training.loop import (
    PROGRESS_FILE,
    Reporter,
    agreed,
    rank_and_world,
    run_epochs,
    seed_everything,
)
from workloads.training.step import adamw, checked_step, data_parallel, optimization_state, start_or_resume

STATE_FILE = "ear_state.pt"
MODEL_DIR = "model"
DOCUMENT_CHARACTERS = 4_000  # d_i as the RD reranker reads it: the model truncates to max_length tokens anyway
ROLES = ("train", "validation", "test")

Run = dict[str, dict[str, float]]

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
class EarInputs:
    """What a worker reads."""

    training_rows: str
    validation_rows: str
    validation_rankings: str
    validation_qrels: dict[str, dict[str, int]]
    relevance_level: int


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
                     spec.ear.depth, f"sentences-v{SPLITTER_VERSION}")
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
        doc_id = min(ranking.items(), key=lambda item: (-item[1], item[0]))[0]
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
                     f"sentences-v{SPLITTER_VERSION}")
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


# ----------------------------------------------------------------------------- choosing


def pair_texts(reranker: str, separator: str, rows: dict[str, list]) -> tuple[list[str], list[str]]:
    """The reranker's input pairs of ``rows`` (columns of ROWS_SCHEMA): RI reads (q, e_i); RD reads
    (q [SEP] e_i, d_i), the expanded query against the document it retrieves first."""
    if reranker == "ri":
        return list(rows["query"]), list(rows["expansion"])
    firsts = [f"{q} {separator} {e}".strip() for q, e in zip(rows["query"], rows["expansion"])]
    return firsts, list(rows["top_document"])


def _separator(model: CrossEncoder) -> str:
    return model.tokenizer.sep_token or "|"


def chosen_expansions(model: CrossEncoder, reranker: str, rows_path: str, batch_size: int, precision: str,
                      label: str, device: torch.device | None = None) -> dict[str, int]:
    """Each query's expansion with the lowest M (the best estimated rank; the first among ties)."""
    rows = pq.read_table(rows_path, columns=["query_id", "query", "expansion_index", "expansion", "top_document"]).to_pydict()
    firsts, seconds = pair_texts(reranker, _separator(model), rows)
    started, last = time.perf_counter(), [time.perf_counter()]

    def progress(done: int, total: int) -> None:
        if time.perf_counter() - last[0] >= 30 or done == total:
            last[0] = time.perf_counter()
            get_logger("score").info(f"{label}: {done:,}/{total:,} expansions ({done / max(last[0] - started, 1e-9):.1f}/s)")

    scores = score_pairs(model, firsts, seconds, batch_size, device, progress, precision)
    best: dict[str, tuple[float, int]] = {}
    for qid, index, score in zip(rows["query_id"], rows["expansion_index"], scores):
        if qid not in best or (score, index) < best[qid]:
            best[qid] = (score, index)
    return {qid: index for qid, (_, index) in best.items()}


def chosen_run(rankings_path: str, chosen: dict[str, int]) -> Run:
    """The BM25 rankings of the chosen expansions (a query whose expansion retrieved nothing is absent)."""
    # Joined in Arrow: only the chosen 1/n of the rows (n expansions x depth hits per query)
    # become Python objects, in every epoch's validation too.
    wanted = pa.table({"query_id": pa.array(list(chosen), pa.string()),
                       "expansion_index": pa.array(list(chosen.values()), pa.int32())})
    table = pq.read_table(rankings_path, columns=["query_id", "expansion_index", "doc_id", "score"]).join(
        wanted, ["query_id", "expansion_index"], join_type="inner")
    run: Run = {}
    for qid, doc_id, score in zip(*(table.column(c).to_pylist() for c in ("query_id", "doc_id", "score"))):
        run.setdefault(qid, {})[doc_id] = score
    return run


# ----------------------------------------------------------------------------- train


class EarObjective(torch.nn.Module):
    """The reranker and EAR's loss as one module (what data-parallel training wraps): ``inputs``
    is the step's pairs, ``ranks`` their labels (queries x expansions)."""

    def __init__(self, model: CrossEncoder, alpha: float, amp_dtype: torch.dtype | None) -> None:
        super().__init__()
        self.model, self.alpha, self.amp_dtype = model, alpha, amp_dtype

    def forward(self, inputs: dict[str, torch.Tensor], ranks: torch.Tensor) -> torch.Tensor:
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            scores, _ = self.model(**inputs)
        return ear_loss(scores.float().view(ranks.shape), ranks, self.alpha)


def training_groups(rows_path: str, max_rank: int) -> list[tuple[list[int], torch.Tensor]]:
    """(row indices, labels) per training query whose expansions do not all tie: a query whose
    labels are all equal has no pair, so no loss."""
    table = pq.read_table(rows_path, columns=["query_id", "rank"]).to_pydict()
    by_query: dict[str, list[int]] = {}
    for i, qid in enumerate(table["query_id"]):
        by_query.setdefault(qid, []).append(i)
    groups = []
    for indices in by_query.values():
        labels = [table["rank"][i] or max_rank for i in indices]
        if len(set(labels)) > 1:
            groups.append((indices, torch.tensor(labels, dtype=torch.float32)))
    return groups


def train_ear(spec: EarTrialSpec, inputs: EarInputs, report: Reporter, device: torch.device | None = None,
              resume_from: Path | None = None, stop_requested: Callable[[], bool] | None = None) -> None:
    """Train the query reranker and report every epoch (the one epoch loop of every kind).
    ``stop_requested`` (asked by rank 0 after every step, agreed by all workers) ends training
    early: a sweep's pruner stopping the trial."""
    hooks = EarEpochs(spec, inputs, device or torch.device("cpu"), resume_from, stop_requested)
    if hooks.stopping.exhausted:
        return
    run_epochs(hooks, range(hooks.first_epoch, spec.ear.epochs + 1), spec.ear.epochs, hooks.stopping, report,
               hooks.rank, hooks.world)


class EarEpochs:
    """The EAR kind's :class:`~workloads.training.loop.EpochHooks`."""

    label = "ear"
    state_file = STATE_FILE

    def __init__(self, spec: EarTrialSpec, inputs: EarInputs, device: torch.device, resume_from: Path | None,
                 stop_requested: Callable[[], bool] | None = None):
        self.rank, self.world = rank_and_world()
        self.spec, self.inputs, self.device, self.stop_requested = spec, inputs, device, stop_requested
        ear = spec.ear
        seed_everything(spec.seed)
        source = str(resume_from) if resume_from is not None else spec.model.name
        self.model = CrossEncoder.from_pretrained(source, spec.model.max_length, spec.model.pooling).to(device)
        self.objective = EarObjective(self.model, ear.alpha, autocast_dtype(device, spec.precision))
        self.wrapped = data_parallel(self.objective, self.world, device)
        self.optimizer = adamw([{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": ear.learning_rate}])
        self.scheduler = get_constant_schedule_with_warmup(self.optimizer, ear.warmup_steps)
        start_or_resume(self, resume_from, ear.patience)
        self.rows = pq.read_table(inputs.training_rows).to_pydict()
        self.groups = training_groups(inputs.training_rows, ear.max_rank)
        self.steps = (len(self.groups) // ear.queries_per_step) // self.world
        if self.steps == 0:
            raise ValueError(f"{len(self.groups)} training queries whose expansions rank differently make no step of "
                             f"{ear.queries_per_step} queries per worker x {self.world} workers")
        self.say(f"EAR-{ear.reranker.upper()}: {len(self.groups)} training queries with a choice to learn, "
                 f"{self.steps} steps/epoch of {ear.queries_per_step} queries x {spec.expansion.n} expansions, "
                 f"alpha {ear.alpha}, MAX_RANK {ear.max_rank}, on {device}")

    def say(self, message: str) -> None:
        if self.rank == 0:
            get_logger("ear").info(message)

    def train_epoch(self, epoch: int) -> dict[str, float] | None:
        self.wrapped.train()
        order = list(range(len(self.groups)))
        random.Random(self.spec.seed * 1_000 + epoch).shuffle(order)
        per_step = self.spec.ear.queries_per_step
        mine = [order[s * per_step:(s + 1) * per_step] for s in range(self.rank, self.steps * self.world, self.world)]
        separator = _separator(self.model)
        started, total = time.perf_counter(), 0.0
        for step, group_indices in enumerate(mine, 1):
            groups = [self.groups[g] for g in group_indices]
            indices = [i for row_indices, _ in groups for i in row_indices]
            rows = {column: [self.rows[column][i] for i in indices] for column in ("query", "expansion", "top_document")}
            firsts, seconds = pair_texts(self.spec.ear.reranker, separator, rows)
            pairs = self.model.encode(firsts, seconds).to(self.device)
            ranks = torch.stack([labels for _, labels in groups]).to(self.device)
            advice = (f"an EAR step of {len(indices)} pairs does not fit on {self.device}: lower ear.queries_per_step or "
                      "model.max_length")
            total += float(checked_step(advice, self.wrapped, self.objective, self.optimizer, self.scheduler, self.scaler,
                                        [(pairs.inputs, ranks)], 1.0))
            if self.stop_requested is not None and agreed(self.rank == 0 and self.stop_requested(), self.world):
                self.say(f"stopping in epoch {epoch}, step {step}: requested (pruned)")
                return None
            if step % max(1, len(mine) // 5) == 0 or step == len(mine):
                self.say(f"epoch {epoch} {progress_bar(step, len(mine))} step {step}/{len(mine)} loss {total / step:.4f}")
        return {"epoch": epoch, "train_loss": total / len(mine), "epoch_train_seconds": time.perf_counter() - started}

    def validate(self, epoch: int) -> dict[str, float]:
        chosen = chosen_expansions(self.model, self.spec.ear.reranker, self.inputs.validation_rows,
                                   self.spec.ear.eval_batch_size, self.spec.precision, f"validate EAR epoch {epoch}",
                                   self.device)
        evaluation = evaluate(chosen_run(self.inputs.validation_rankings, chosen), self.inputs.validation_qrels,
                              self.inputs.relevance_level, RETRIEVAL_MEASURES)
        return validation_values(evaluation)

    def save(self, checkpoint: Path, resumable: bool) -> dict:
        self.model.save(checkpoint)
        if not resumable:
            return {}
        return optimization_state(self.optimizer, self.scheduler, self.scaler)

    def describe(self, metrics: dict[str, float]) -> str:
        return f" (recall@100 {metrics.get('val_recall_at_100', 0.0):.4f})"


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


__all__ = ["EarInputs", "EarSplit", "PreparedEar", "chosen_expansions", "chosen_run", "ear_loss", "keep_ear",
           "kept_reranker", "pair_texts", "prepare_ear", "test_ear", "train_ear", "training_groups", "transferred_choice"]
