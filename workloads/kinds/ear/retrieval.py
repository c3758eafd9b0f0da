"""BM25 with expanded queries: one search per (query, expansion), the ranks EAR learns from, and
the systems that use expansions without a learned choice.

EAR's label of an expansion e_i of query q is r_i, the best (lowest) rank of a relevant
document in BM25's top ``depth`` for the query ``q e_i``; ``max_rank`` when none is there.
Every expanded query of a split is searched in one Anserini call, cached like any BM25 run.
"""

from __future__ import annotations

import dataclasses

from workloads.core.errors import InputError
from workloads.data.collections import Collection, Qrels
from workloads.evaluation.ranking import trec_eval_order
from workloads.kinds.ear.sources import Expansions
from workloads.retrieval.bm25 import BM25Params, RM3Params, read_trec_run, retrieved_run

Run = dict[str, dict[str, float]]
SEPARATOR = "::"  # an expanded query's topic id: <query id>::<expansion number>

# What uses expansions without a learned choice, beside the first stages (GAR's comparisons):
# the first (greedy) expansion, all of them in one query, and the oracle that picks each
# query's best expansion with the test labels (the headroom of any choice).
SYSTEMS = ("bm25", "rm3", "first", "concatenated", "oracle")


def expanded_query(text: str, expansion: str) -> str:
    return f"{text} {expansion}".strip()


def expansion_runs(collection: Collection, queries: dict[str, str], expanded: Expansions, depth: int,
                   params: BM25Params = BM25Params()) -> dict[str, list[dict[str, float]]]:
    """Each query's BM25 ranking (top ``depth``) for each of its expansions, in expansion order."""
    missing = sorted(q for q in queries if not expanded.get(q))
    if missing:
        raise InputError(collection.name, f"{len(missing)} queries have no expansions (e.g. '{missing[0]}')")
    topics = {f"{qid}{SEPARATOR}{i}": expanded_query(queries[qid], e) for qid in queries for i, e in enumerate(expanded[qid])}
    # The topic id is not the query's id, so Anserini cannot drop the query's own document (the
    # BEIR convention): one more hit is asked for and the query's id dropped here.
    searched = dataclasses.replace(params, exclude_query_id=False)
    run = read_trec_run(retrieved_run(collection, topics, k=depth + 1, params=searched))
    out: dict[str, list[dict[str, float]]] = {}
    for qid in queries:
        rankings = []
        for i in range(len(expanded[qid])):
            hits = run.get(f"{qid}{SEPARATOR}{i}", {})
            ordered = trec_eval_order(hits)
            kept = [(d, s) for d, s in ordered if not (params.exclude_query_id and d == qid)][:depth]
            rankings.append(dict(kept))
        out[qid] = rankings
    return out


def best_rank(ranking: dict[str, float], judged: dict[str, int], relevance_level: int, max_rank: int) -> int:
    """The rank (1 = top) of the first relevant document of ``ranking``; ``max_rank`` when it has none."""
    ordered = trec_eval_order(ranking)
    return next((rank for rank, (doc_id, _) in enumerate(ordered, 1) if judged.get(doc_id, 0) >= relevance_level),
                max_rank)


def expansion_ranks(runs: dict[str, list[dict[str, float]]], qrels: Qrels, relevance_level: int,
                    max_rank: int) -> dict[str, list[int]]:
    """EAR's labels: r_i of every expansion of every judged query."""
    return {qid: [best_rank(r, qrels[qid], relevance_level, max_rank) for r in rankings]
            for qid, rankings in runs.items() if qid in qrels}


def unchosen_systems(collection: Collection, queries: dict[str, str], expanded: Expansions, qrels: Qrels,
                     relevance_level: int, depth: int, params: BM25Params = BM25Params(),
                     rm3: RM3Params = RM3Params()) -> dict[str, Run]:
    """The runs (top ``depth``) of :data:`SYSTEMS`: BM25, RM3, the first expansion, all expansions
    concatenated, and the oracle (each judged query's best expansion by its label, the first
    among ties; the first expansion for a query without judgements)."""
    runs = expansion_runs(collection, queries, expanded, depth, params)
    bm25 = read_trec_run(retrieved_run(collection, queries, k=depth, params=params))
    with_rm3 = read_trec_run(retrieved_run(collection, queries, k=depth, params=params, rm3=rm3))
    concatenated_topics = {qid: expanded_query(text, " ".join(expanded[qid])) for qid, text in queries.items()}
    concatenated = read_trec_run(retrieved_run(collection, concatenated_topics, k=depth, params=params))
    ranks = expansion_ranks(runs, qrels, relevance_level, depth + 1)
    oracle = {qid: rankings[min(range(len(rankings)), key=lambda i: ranks[qid][i])] if qid in ranks else rankings[0]
              for qid, rankings in runs.items()}
    return {"bm25": bm25, "rm3": with_rm3, "first": {qid: rankings[0] for qid, rankings in runs.items()},
            "concatenated": concatenated, "oracle": oracle}


__all__ = ["SEPARATOR", "SYSTEMS", "best_rank", "expanded_query", "expansion_ranks", "expansion_runs", "unchosen_systems"]
