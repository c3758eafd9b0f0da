"""Training sets of fixed size from first-stage candidates (AUG 4.3, 6.3).

For every training query, every judged-relevant document found in the first-stage top-k is
paired with one non-relevant document drawn uniformly from the same query's retrieved,
non-relevant documents; the triples are shuffled. A set of **size N counts query-document
pairs**: N/2 triples. Sets are deterministic per seed and nested (the 1k set is the first
half of the 2k set for the same seed), stored once as Parquet and reused by every trial
that asks for the same (collection, split, queries, k, size, seed).

Which queries are retrieved (``training_data.queries``):

- ``all`` (the default, every earlier set): every training query that has a judged-relevant
  document is retrieved and all their triples are shuffled together, so every such query's
  ranking decides the rows (how many triples there are and the draws before the shuffle). A
  query without one yields no triple and draws nothing: it is not retrieved.
- ``as_needed``: the judged queries in an order drawn by the seed, retrieved in chunks
  that double from 256 to 16,384 queries (:func:`draw_chunks`); each chunk's triples are
  drawn and shuffled, and retrieval stops once the set is full. A set of N pairs retrieves
  the queries of about N/2 rows, up to the end of their chunk (MS MARCO document: 100k pairs
  from 65,280 of its 367,013 training queries), and the sets of one seed are still nested.
  Other rows than ``all``'s: a trial asking for it is keyed apart.

With a miner (``training_data.mining``, :mod:`workloads.retrieval.mining`) the positives are
the same and the negatives are mined: chosen from a trained model's scores (a dense run, or the
first stage's list re-scored by a kept cross-encoder) with its depth, skip and margin filters,
and every row keeps the miner's scores (``positive_score``, ``negative_score``, with lists
``negative_scores``) for distillation. Such a set is keyed apart; an un-mined set is as before.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workloads.core.errors import InputError
from workloads.core.logs import clock, get_logger
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.core.seeds import derived_seed
from workloads.data.collections import Collection, Qrels
from workloads.data.parquet_rows import write_rows
from workloads.evaluation.ranking import TIE_ORDER, ranked_ids
from workloads.retrieval.first_stage import FirstStageRun
from workloads.retrieval.mining import choose_negatives, negative_pool

Run = dict[str, dict[str, float]]

# Validation queries are carved with a fixed seed, independent of the trial seed, so every
# trial of a study selects models on the same queries and never trains on them.
VALIDATION_CARVE_SEED = 20231126
_STATS_KEY = b"rerank_lab.triple_stats"  # a training set's TripleStats, in its Parquet schema's metadata


@dataclass(frozen=True)
class Triple:
    """A training row: one judged-relevant document and its negatives of the same query (the
    first in ``negative_id``, any others, with ``training_data.negatives`` > 1, after it)."""

    query_id: str
    positive_id: str
    negative_id: str
    more_negative_ids: tuple[str, ...] = ()
    positive_score: float | None = None    # mined: the miner's score of the positive
    negative_scores: tuple[float, ...] = ()  # mined: its scores of negative_id, then of more_negative_ids


@dataclass(frozen=True)
class TripleStats:
    queries: int
    positives_judged: int
    positives_retrieved: int
    queries_without_negative: int
    triples: int


def carve_validation_queries(query_ids: list[str], count: int, source: str) -> tuple[list[str], list[str]]:
    """Split ``query_ids`` into (train, validation) deterministically; validation has ``count``."""
    ordered = sorted(query_ids)
    if count >= len(ordered):
        raise InputError(source, f"cannot carve {count} validation queries from {len(ordered)} training queries")
    validation = set(random.Random(VALIDATION_CARVE_SEED).sample(ordered, count))
    return [q for q in ordered if q not in validation], sorted(validation)


def capped_validation_queries(query_ids: list[str], cap: int | None) -> list[str]:
    """At most ``cap`` of a validation split's queries, drawn by a seed of the cap alone: the same
    queries for every trial that caps that split at that size (whatever its own seed), in id order."""
    ordered = sorted(query_ids)
    if cap is None or cap >= len(ordered):
        return ordered
    return sorted(random.Random(derived_seed("validation-cap", cap)).sample(ordered, cap))


def drawable_queries(query_ids: Iterable[str], qrels: Qrels, relevance_level: int) -> list[str]:
    """The queries that can yield a training row: those with a judged-relevant document. The
    others draw nothing and add no triple (:func:`sample_triples`): they need no retrieval."""
    return sorted(q for q in query_ids if any(g >= relevance_level for g in qrels.get(q, {}).values()))


@dataclass
class _Counts:
    judged: int = 0
    retrieved: int = 0
    no_negative: int = 0


def _query_triples(qid: str, ranking: dict[str, float], grades: dict[str, int], relevance_level: int, depth: int,
                   rng: random.Random, negatives: int, counts: _Counts) -> list[Triple]:
    """One query's triples: each judged-relevant document of its top-``depth`` with negatives
    drawn from the rest of that top (the draws of every training set, in this order)."""
    counts.judged += sum(1 for g in grades.values() if g >= relevance_level)
    top = ranked_ids(ranking)[:depth]
    positives = [d for d in top if grades.get(d, 0) >= relevance_level]
    pool = [d for d in top if grades.get(d, 0) < relevance_level]
    counts.retrieved += len(positives)
    if positives and not pool:
        counts.no_negative += 1
        return []
    triples = []
    for pos in positives:
        if negatives == 1:  # the draw of every training set made before lists existed
            triples.append(Triple(qid, pos, rng.choice(pool)))
        else:
            drawn = rng.sample(pool, min(negatives, len(pool)))
            triples.append(Triple(qid, pos, drawn[0], tuple(drawn[1:])))
    return triples


MINED_CHUNK = 256  # training queries a miner scores at once


def _mined_triples(rankings: Iterable[tuple[str, dict[str, float]]], queries: dict[str, str], qrels: Qrels,
                   relevance_level: int, depth: int, rng: random.Random, negatives: int, counts: _Counts,
                   miner) -> Iterable[Triple]:
    """Each query's triples as :func:`_query_triples` gives them (the same positives), with
    negatives mined (:mod:`workloads.retrieval.mining`), ``MINED_CHUNK`` queries scored at once."""
    def chunk_triples(chunk: dict[str, dict[str, float]]) -> list[Triple]:
        positives = {}
        for qid, ranking in chunk.items():
            grades = qrels.get(qid, {})
            counts.judged += sum(1 for g in grades.values() if g >= relevance_level)
            positives[qid] = [d for d in ranked_ids(ranking)[:depth] if grades.get(d, 0) >= relevance_level]
            counts.retrieved += len(positives[qid])
        scored = miner.score({q: queries[q] for q in chunk}, chunk, positives)
        found = []
        for qid in chunk:
            candidates, positive_scores = scored[qid]
            relevant = {d for d, g in qrels.get(qid, {}).items() if g >= relevance_level}
            pool = negative_pool(candidates, positive_scores, relevant, miner.options)
            if positives[qid] and not pool:
                counts.no_negative += 1
                continue
            for pos in positives[qid]:
                drawn = choose_negatives(pool, negatives, miner.options.sampling, rng)
                found.append(Triple(qid, pos, drawn[0][0], tuple(d for d, _ in drawn[1:]), positive_scores[pos],
                                    tuple(s for _, s in drawn)))
        return found

    chunk: dict[str, dict[str, float]] = {}
    for qid, ranking in rankings:
        chunk[qid] = ranking
        if len(chunk) == MINED_CHUNK:
            yield from chunk_triples(chunk)
            chunk = {}
    if chunk:
        yield from chunk_triples(chunk)


def sample_triples(
    run: Run | FirstStageRun, qrels: Qrels, query_ids: list[str], relevance_level: int, depth: int, seed: int,
    negatives: int = 1, miner=None, queries: dict[str, str] | None = None,
) -> tuple[list[Triple], TripleStats]:
    """All (q, d+, d-) triples from the top-``depth`` of ``run``, shuffled by ``seed``; with
    ``negatives`` > 1, each positive draws that many distinct negatives (all when the query
    has fewer). A :class:`FirstStageRun` is read one query at a time. With a ``miner``
    (``queries``: the texts it scores), the negatives are mined (:func:`_mined_triples`)."""
    rng = random.Random(seed)
    triples: list[Triple] = []
    counts = _Counts()
    ordered = drawable_queries(query_ids, qrels, relevance_level)  # the others add nothing and draw nothing
    rankings = run.rankings(ordered) if isinstance(run, FirstStageRun) else ((q, run.get(q, {})) for q in ordered)
    if miner is not None:
        triples += _mined_triples(rankings, queries, qrels, relevance_level, depth, rng, negatives, counts, miner)
    for qid, ranking in rankings if miner is None else ():
        triples += _query_triples(qid, ranking, qrels.get(qid, {}), relevance_level, depth, rng, negatives, counts)
    rng.shuffle(triples)
    stats = TripleStats(len(query_ids), counts.judged, counts.retrieved, counts.no_negative, len(triples))
    return triples, stats


# Queries retrieved at once by ``training_data.queries: as_needed``: chunks that double from
# the first to the largest, so a small set retrieves little and a large one launches few
# searches (part of what its sets are: other chunks would draw other rows).
FIRST_CHUNK, LARGEST_CHUNK = 256, 16_384


def draw_chunks(order: list[str]) -> list[list[str]]:
    """``order`` cut into :data:`FIRST_CHUNK`, twice that, ... up to :data:`LARGEST_CHUNK` queries."""
    chunks, start, size = [], 0, FIRST_CHUNK
    while start < len(order):
        chunks.append(order[start:start + size])
        start, size = start + size, min(2 * size, LARGEST_CHUNK)
    return chunks


def draw_as_needed(retrieve: Callable[[list[str]], FirstStageRun], qrels: Qrels, query_ids: list[str], relevance_level: int,
                   depth: int, seed: int, negatives: int, rows: int | None, what: str, miner=None,
                   queries: dict[str, str] | None = None) -> tuple[list[Triple], TripleStats]:
    """``training_data.queries: as_needed``: the judged queries in an order drawn by ``seed``,
    retrieved (``retrieve``: a chunk's first-stage run) in :func:`draw_chunks` of that order;
    each chunk's triples drawn as :func:`sample_triples` draws a query's, then shuffled, until
    ``rows`` rows are drawn (``None``: every query). A smaller set of the same seed is a prefix
    of a larger one and retrieves a prefix of its chunks. Logs each chunk with an ETA."""
    order = drawable_queries(query_ids, qrels, relevance_level)
    random.Random(derived_seed("training-query-order", seed)).shuffle(order)
    rng = random.Random(seed)
    triples: list[Triple] = []
    counts = _Counts()
    drawn = 0
    chunks = draw_chunks(order)
    started = time.perf_counter()
    log = get_logger("data")
    for number, chunk in enumerate(chunks, 1):
        if rows is not None and len(triples) >= rows:
            break
        found: list[Triple] = []
        if miner is not None:
            found += _mined_triples(retrieve(chunk).rankings(chunk), queries, qrels, relevance_level, depth, rng, negatives,
                                    counts, miner)
        for qid, ranking in retrieve(chunk).rankings(chunk) if miner is None else ():
            found += _query_triples(qid, ranking, qrels.get(qid, {}), relevance_level, depth, rng, negatives, counts)
        rng.shuffle(found)
        triples += found
        drawn += len(chunk)
        elapsed = time.perf_counter() - started
        if rows is None:
            left = elapsed / drawn * (len(order) - drawn)
        else:
            left = elapsed / max(1, len(triples)) * max(0, rows - len(triples)) if triples else float("nan")
        log.info(f"training queries of {what}: chunk {number} ({drawn:,} of {len(order):,} judged queries retrieved), "
                 f"{len(triples):,}{'' if rows is None else f' of {rows:,}'} rows, {elapsed:.0f}s, ETA {clock(left)}")
    return triples, TripleStats(drawn, counts.judged, counts.retrieved, counts.no_negative, len(triples))


def select_size(triples: list[Triple], size: int | str, source: str, pairs_per_row: int = 2) -> list[Triple]:
    """The first rows making ``size`` pairs (rows of ``pairs_per_row``: 2 for triples)."""
    if size == "full":
        return triples
    needed = int(size) // pairs_per_row
    if needed > len(triples):
        raise InputError(
            source,
            f"training size {size} needs {needed} {'triples' if pairs_per_row == 2 else f'rows of {pairs_per_row} pairs'} "
            f"but the first stage yields only {len(triples)}: choose a smaller size or 'full'",
        )
    return triples[:needed]


TRAINING_SCHEMA = pa.schema([
    ("query_id", pa.string()), ("query", pa.string()),
    ("positive_id", pa.string()), ("positive", pa.string()),
    ("negative_id", pa.string()), ("negative", pa.string()),
])
# With negatives > 1: every negative of the row (the first one is negative_id again).
LIST_SCHEMA = TRAINING_SCHEMA.append(pa.field("negative_ids", pa.list_(pa.string()))).append(
    pa.field("negatives", pa.list_(pa.string())))
# Mined sets: the miner's scores too (with negatives > 1, of every negative in negative_scores).
MINED_FIELDS = (pa.field("positive_score", pa.float64()), pa.field("negative_score", pa.float64()))
MINED_LIST_FIELD = pa.field("negative_scores", pa.list_(pa.float64()))


def training_schema(negatives: int, mined: bool) -> pa.Schema:
    schema = LIST_SCHEMA if negatives > 1 else TRAINING_SCHEMA
    for extra in (*MINED_FIELDS, *((MINED_LIST_FIELD,) if negatives > 1 else ())) if mined else ():
        schema = schema.append(extra)
    return schema


def build_training_set(
    collection: Collection,
    split: str,
    query_ids: list[str],
    first_stage: FirstStageRun | None,
    depth: int,
    size: int | str,
    seed: int,
    negatives: int = 1,
    retrieve: Callable[[list[str]], FirstStageRun] | None = None,
    miner=None,
) -> tuple[Path, TripleStats]:
    """The Parquet training set for these inputs, built once and then reused: a set already
    built is found by its key alone, without reading the first stage's run (its statistics are
    stored with it). ``first_stage``: the run of the training queries (``queries: all``; the
    judged ones are enough, :func:`drawable_queries`); or ``retrieve``, a chunk of queries'
    run, for ``queries: as_needed`` (:func:`draw_as_needed`). ``miner``: negatives mined by it
    (:mod:`workloads.retrieval.mining`; its key and options join the set's key)."""
    qrels = collection.split_qrels(split)
    if retrieve is not None:
        # keyed by the first chunk's run (the first stage's settings and index): cached, so a
        # set already built costs no retrieval
        order = drawable_queries(query_ids, qrels, collection.relevance_level)
        random.Random(derived_seed("training-query-order", seed)).shuffle(order)
        if not order:
            raise InputError(f"{collection.name} {split}", "no training query has a judged-relevant document")
        run_key = ("as_needed", FIRST_CHUNK, LARGEST_CHUNK, retrieve(draw_chunks(order)[0]).key)
    else:
        run_key = (first_stage.key,)
    mined = () if miner is None else ("mined", miner.key, miner.options)
    key = stable_key(collection.fingerprint, split, sorted(query_ids), *run_key, depth, size, seed,
                     *((negatives,) if negatives > 1 else ()), *mined, TIE_ORDER)
    path = cache_dir() / "training" / f"{collection.name.replace('/', '_')}-{split}-{size}-s{seed}-{key}.parquet"
    if path.exists():
        stored = pq.read_schema(path).metadata or {}
        if _STATS_KEY in stored:
            return path, TripleStats(**json.loads(stored[_STATS_KEY]))
    if retrieve is not None:
        rows = None if size == "full" else int(size) // (1 + negatives)
        triples, stats = draw_as_needed(retrieve, qrels, query_ids, collection.relevance_level, depth, seed, negatives, rows,
                                        f"{collection.name} {split} (seed {seed})", miner, collection.queries)
    else:
        triples, stats = sample_triples(first_stage, qrels, query_ids, collection.relevance_level, depth, seed, negatives,
                                        miner, collection.queries)
    chosen = select_size(triples, size, f"{collection.name} {split}", 1 + negatives)
    if path.exists():  # built before its statistics were stored with it
        return path, stats
    pairs = sum(2 + len(t.more_negative_ids) for t in chosen)
    get_logger("data").info(f"training set: {len(chosen)} rows ({pairs} pairs) from {stats.triples} available -> {path}")

    def row(t: Triple) -> dict:
        out = {"query_id": t.query_id, "query": collection.queries[t.query_id],
               "positive_id": t.positive_id, "positive": collection.document(t.positive_id).contents,
               "negative_id": t.negative_id, "negative": collection.document(t.negative_id).contents}
        if negatives > 1:
            ids = [t.negative_id, *t.more_negative_ids]
            out |= {"negative_ids": ids, "negatives": [collection.document(d).contents for d in ids]}
        if miner is not None:
            out |= {"positive_score": t.positive_score, "negative_score": t.negative_scores[0]}
            if negatives > 1:
                out["negative_scores"] = list(t.negative_scores)
        return out

    schema = training_schema(negatives, miner is not None).with_metadata({_STATS_KEY: json.dumps(asdict(stats))})
    with atomic_path(path, ".parquet") as tmp:
        write_rows(tmp, schema, (row(t) for t in chosen))
    return path, stats


CANDIDATE_SCHEMA = pa.schema([
    ("query_id", pa.string()), ("query", pa.string()), ("doc_id", pa.string()), ("doc", pa.string()),
    ("first_stage_rank", pa.int32()), ("first_stage_score", pa.float64()),
])


def build_candidates(collection: Collection, queries: dict[str, str], first_stage: FirstStageRun, depth: int) -> Path:
    """The top-``depth`` first-stage candidates of ``queries`` with their texts, for re-ranking."""
    # the texts, not only the ids: a perturbed query set has the same ids and other texts
    key = stable_key(collection.fingerprint, sorted(queries.items()), first_stage.key, depth, TIE_ORDER)
    path = cache_dir() / "candidates" / f"{collection.name.replace('/', '_')}-top{depth}-{key}.parquet"
    if path.exists():
        return path
    def rows():
        for qid, docs in first_stage.rankings(sorted(queries)):  # one query's ranking at a time
            for rank, doc_id in enumerate(ranked_ids(docs)[:depth], 1):
                yield {"query_id": qid, "query": queries[qid], "doc_id": doc_id,
                       "doc": collection.document(doc_id).contents, "first_stage_rank": rank,
                       "first_stage_score": docs[doc_id]}

    with atomic_path(path, ".parquet") as tmp:
        write_rows(tmp, CANDIDATE_SCHEMA, rows())
    return path
