"""``orchestrate bm25``: the first stage's metrics on a collection split."""

from __future__ import annotations

import argparse
import dataclasses
import json

from orchestrator.cli.output import HelpFormatter, bounded, emit, metrics_table
from workloads.core.errors import InputError
from workloads.evaluation import evaluate
from workloads.retrieval.bm25 import BM25Params, RM3Params, retrieve


def add_parser(sub, common) -> None:
    parser = sub.add_parser("bm25", help="BM25 first stage (Pyserini; --rm3: with RM3 expansion) on a collection split, "
                                         "with its metrics", parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("--dataset", required=True, help="beir/<name>, a directory, or an ir_datasets id")
    parser.add_argument("--split", default="test", help="the split whose queries are retrieved and judged")
    parser.add_argument("--k", type=bounded(int, 1, what="hits per query"), default=1000, help="hits per query")
    parser.add_argument("--k1", type=bounded(float, 1e-9, what="k1 (term frequency saturation, > 0)"), default=0.9,
                        help="BM25 k1 (Pyserini's BEIR default)")
    parser.add_argument("--b", type=bounded(float, 0.0, 1.0, what="b (length normalisation)"), default=0.4,
                        help="BM25 b (Pyserini's BEIR default)")
    parser.add_argument("--rm3", action="store_true", help="BM25 with RM3 query expansion (Pyserini's set_rm3)")
    # 1000: workloads.retrieval.bm25.MAX_FB_TERMS (Lucene's 1024 clauses per query hold them and the query's own)
    parser.add_argument("--fb-terms", type=bounded(int, 1, 1000, what="RM3 expansion terms"), default=10,
                        help="--rm3: expansion terms")
    parser.add_argument("--fb-docs", type=bounded(int, 1, what="RM3 feedback documents"), default=10,
                        help="--rm3: feedback documents")
    parser.add_argument("--original-query-weight", type=bounded(float, 0.0, 1.0, what="the original query's weight"),
                        default=0.5, help="--rm3: the original query's weight")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workloads.data.resolve import resolve_collection

    if not args.rm3 and (args.fb_terms, args.fb_docs, args.original_query_weight) != (10, 10, 0.5):
        raise InputError("--fb-terms/--fb-docs/--original-query-weight", "set RM3's options: add --rm3")
    collection = resolve_collection(args.dataset)
    queries = collection.split_queries(args.split)
    params = BM25Params(k1=args.k1, b=args.b)
    rm3 = RM3Params(args.fb_terms, args.fb_docs, args.original_query_weight) if args.rm3 else None
    ranked, run_path = retrieve(collection, queries, k=args.k, params=params, rm3=rm3)
    evaluation = evaluate(ranked, collection.split_qrels(args.split), collection.relevance_level)
    name = "BM25+RM3" if rm3 else "BM25"
    if args.json:
        emit(json.dumps({
            "dataset": args.dataset, "split": args.split, "k": args.k, "k1": args.k1, "b": args.b,
            **({"rm3": dataclasses.asdict(rm3)} if rm3 else {}),
            "queries": evaluation.num_queries, "relevance_level": evaluation.relevance_level,
            "run": str(run_path), "metrics": evaluation.aggregate,
        }, indent=2))
    else:
        feedback = f", RM3 fb_terms={rm3.fb_terms} fb_docs={rm3.fb_docs} weight={rm3.original_query_weight}" if rm3 else ""
        emit(f"{name} (k1={args.k1}, b={args.b}{feedback}) top-{args.k} on {args.dataset} {args.split}: "
             f"{evaluation.num_queries} queries, binary relevance >= {evaluation.relevance_level}")
        emit(metrics_table([(name, evaluation.aggregate)]))
        emit(f"run: {run_path}")
    return 0
