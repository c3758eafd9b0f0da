"""``orchestrate bm25``: the first stage's metrics on a collection split."""

from __future__ import annotations

import argparse
import json

from orchestrator.cli.output import HelpFormatter, bounded, emit, metrics_table


def add_parser(sub, common) -> None:
    parser = sub.add_parser("bm25", help="BM25 first stage (Pyserini) on a collection split, with its metrics", parents=[common],
                            formatter_class=HelpFormatter)
    parser.add_argument("--dataset", required=True, help="beir/<name>, a directory, or an ir_datasets id")
    parser.add_argument("--split", default="test", help="the split whose queries are retrieved and judged")
    parser.add_argument("--k", type=bounded(int, 1, what="hits per query"), default=1000, help="hits per query")
    parser.add_argument("--k1", type=bounded(float, 1e-9, what="k1 (term frequency saturation, > 0)"), default=0.9,
                        help="BM25 k1 (Pyserini's BEIR default)")
    parser.add_argument("--b", type=bounded(float, 0.0, 1.0, what="b (length normalisation)"), default=0.4,
                        help="BM25 b (Pyserini's BEIR default)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workloads.data.collections import resolve_collection
    from workloads.evaluation import evaluate
    from workloads.retrieval.bm25 import BM25Params, retrieve

    collection = resolve_collection(args.dataset)
    queries = collection.split_queries(args.split)
    params = BM25Params(k1=args.k1, b=args.b)
    ranked, run_path = retrieve(collection, queries, k=args.k, params=params)
    evaluation = evaluate(ranked, collection.split_qrels(args.split), collection.relevance_level)
    if args.json:
        emit(json.dumps({
            "dataset": args.dataset, "split": args.split, "k": args.k, "k1": args.k1, "b": args.b,
            "queries": evaluation.num_queries, "relevance_level": evaluation.relevance_level,
            "run": str(run_path), "metrics": evaluation.aggregate,
        }, indent=2))
    else:
        emit(f"BM25 (k1={args.k1}, b={args.b}) top-{args.k} on {args.dataset} {args.split}: "
             f"{evaluation.num_queries} queries, binary relevance >= {evaluation.relevance_level}")
        emit(metrics_table([("BM25", evaluation.aggregate)]))
        emit(f"run: {run_path}")
    return 0
