"""``orchestrate compare``: two runs (or a run and its first stage) query by query."""

from __future__ import annotations

import argparse
import json

from orchestrator.cli.output import HelpFormatter, add_tracking, bounded, emit
from orchestrator.cli.report import _open


def add_parser(sub, common) -> None:
    from workloads.evaluation.significance import PAIRED_TESTS

    parser = sub.add_parser("compare", help="two MLflow runs (cells or tested trials), or a run and its BM25: measures, "
                                            "p-values, most changed queries (`orchestrate runs FILE` lists the ids)",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("run_a", metavar="RUN_A", help="an MLflow run id (RUN:bm25 is that run's first stage)")
    parser.add_argument("run_b", metavar="RUN_B", nargs="?", help="another run id, or RUN:bm25 (default: RUN_A's own BM25)")
    parser.add_argument("--collection", help="test (default) or a zero-shot collection name")
    parser.add_argument("--test", default="t", choices=list(PAIRED_TESTS), help="the paired test")
    parser.add_argument("--top", type=bounded(int, 0, what="a number of queries"), default=10, help="queries shown")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.report.compare import compare_runs, format_comparison

    args.log = False
    result = compare_runs(_open(args), args.run_a, args.run_b or f"{args.run_a}:bm25", collection=args.collection,
                          test=args.test, top=args.top)
    emit(json.dumps(result, indent=2) if args.json else format_comparison(result))
    return 0
