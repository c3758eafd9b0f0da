"""What preparing a grid's training sets retrieves: every judged training query
(``training_data.queries: all``, the default) or only as many as the sets draw (``as_needed``).

On a collection in BEIR layout (an MS MARCO-shaped one: ``benchmarks/synthetic_collection.py``),
for the grid's sizes and one seed: BM25 (built index, top ``--depth``) of the training queries
and the training sets built from it, each mode timed from a cold run cache (the index is built
first, untimed, and shared). Reported per mode: queries retrieved, searches launched, seconds
of retrieval and of the whole preparation. Then, without retrieving, the same count at MS
MARCO document's scale (367,013 training queries) for doc19's sizes, with the positive found in
the top ``--depth`` as often as it was here (the chunks, hence the count, depend only on that).

    python benchmarks/drawn_queries.py /tmp/synthetic [--sizes 100 1000 2000 10000] [--seed 13] [--depth 100]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

MSMARCO_TRAIN_QUERIES = 367_013
DOC19_SIZES = (100, 1000, 2000, 10000, 100000)


def prepare(collection, mode: str, sizes, seed: int, depth: int) -> dict:
    from workloads.kinds.rerank.training_sets import build_training_set, drawable_queries
    from workloads.retrieval import first_stage as first_stage_module
    from workloads.spec import FirstStageSpec

    spec = FirstStageSpec(train_depth=depth)
    queries = collection.split_queries("train")
    train_ids = list(queries)
    retrieved: set[str] = set()
    searches = 0
    seconds = 0.0

    def run_of(chunk):
        nonlocal searches, seconds
        fresh = set(chunk) - retrieved
        started = time.perf_counter()
        run = first_stage_module.first_stage_run(collection, "train", {q: queries[q] for q in chunk}, depth, spec)
        if fresh:  # a chunk retrieved before is read from the cache
            searches += 1
            seconds += time.perf_counter() - started
            retrieved.update(chunk)
        return run

    started = time.perf_counter()
    rows = {}
    for size in sizes:
        if mode == "all":
            run = run_of(drawable_queries(train_ids, collection.split_qrels("train"), collection.relevance_level))
            path, stats = build_training_set(collection, "train", train_ids, run, depth, size, seed)
        else:
            path, stats = build_training_set(collection, "train", train_ids, None, depth, size, seed, retrieve=run_of)
        rows[size] = stats.triples
    return {"queries_retrieved": len(retrieved), "searches": searches, "retrieval_seconds": round(seconds, 1),
            "preparation_seconds": round(time.perf_counter() - started, 1), "rows_available": rows}


def at_msmarco_scale(found: float, sizes, seed: int) -> dict:
    """Queries ``as_needed`` retrieves for ``sizes`` among 367,013 judged queries, each query's
    positive in the top ``depth`` with probability ``found`` (no retrieval: a stand-in run)."""
    from workloads.kinds.rerank.training_sets import draw_as_needed

    class StandIn:  # the positive at rank 1 when found, else 100 non-relevant documents
        def rankings(self, chunk):
            for qid in chunk:
                hit = random.Random(qid).random() < found
                yield qid, {**({f"pos-{qid}": 200.0} if hit else {}), **{f"neg-{i}": 100.0 - i for i in range(100)}}

    qrels = {f"q{i}": {f"pos-q{i}": 1} for i in range(MSMARCO_TRAIN_QUERIES)}
    asked: set[str] = set()

    def retrieve(chunk):
        asked.update(chunk)
        return StandIn()

    draw_as_needed(retrieve, qrels, list(qrels), 1, 100, seed, 1, max(sizes) // 2, "stand-in")
    return {"training_queries": MSMARCO_TRAIN_QUERIES, "positive_found": round(found, 3), "largest_size": max(sizes),
            "queries_retrieved_as_needed": len(asked), "fraction": round(len(asked) / MSMARCO_TRAIN_QUERIES, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("collection", help="a collection in BEIR layout with a train split")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 2000, 10000])
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--depth", type=int, default=100)
    parser.add_argument("--workdir", default=None, help="its own cache (default: a temporary folder)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "drawn_queries.json"))
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="drawn-queries-"))
    os.environ["ORCHESTRATE_CACHE_DIR"] = str(workdir / "cache")

    from workloads.data.resolve import resolve_collection
    from workloads.retrieval.bm25 import build_index

    collection = resolve_collection(args.collection)
    build_index(collection)  # shared by both modes, not timed
    results = {mode: prepare(collection, mode, sorted(args.sizes), args.seed, args.depth) for mode in ("all", "as_needed")}
    judged = len(collection.split_queries("train"))
    found = results["all"]["rows_available"][max(args.sizes)] / judged  # one positive per query: rows = queries found
    results["msmarco_scale"] = at_msmarco_scale(found, DOC19_SIZES, args.seed)
    # BM25's top 100 misses more of MS MARCO's positives than of these synthetic ones
    results["msmarco_scale_if_found"] = {f: at_msmarco_scale(f, DOC19_SIZES, args.seed) for f in (0.8, 0.6)}
    print(f"{'mode':<11}{'queries':>10}{'searches':>10}{'retrieval s':>13}{'preparation s':>15}")
    for mode in ("all", "as_needed"):
        r = results[mode]
        print(f"{mode:<11}{r['queries_retrieved']:>10,}{r['searches']:>10}{r['retrieval_seconds']:>13.1f}"
              f"{r['preparation_seconds']:>15.1f}")
    scale = results["msmarco_scale"]
    print(f"at MS MARCO document's scale, doc19's sizes (largest {scale['largest_size']:,} pairs): as_needed retrieves "
          f"{scale['queries_retrieved_as_needed']:,} of {scale['training_queries']:,} training queries ({scale['fraction']:.0%}), "
          f"the positive in the top {args.depth} for {scale['positive_found']:.0%} of queries as here; if found for 80%: "
          f"{results['msmarco_scale_if_found'][0.8]['queries_retrieved_as_needed']:,}, 60%: "
          f"{results['msmarco_scale_if_found'][0.6]['queries_retrieved_as_needed']:,}")
    write_results(args.out, args, **results)


if __name__ == "__main__":
    main()
