"""The ``orchestrate`` command line.

Bad input (a malformed file, an unknown dataset, a missing field) prints one line naming
the file and the problem on stderr and exits with code 2; nothing is half-written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workloads.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, MEASURES

EXIT_INPUT_ERROR = 2


def _metrics_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    names = list(MEASURES)
    header = f"{'':<28}" + "".join(f"{DISPLAY_NAMES[n]:>9}" for n in names)
    lines = [header]
    for label, metrics in rows:
        lines.append(f"{label:<28}" + "".join(f"{metrics[n]:>9.4f}" if n in metrics else f"{'-':>9}" for n in names))
    return "\n".join(lines)


def cmd_bm25(args: argparse.Namespace) -> int:
    from workloads.collections import resolve_collection
    from workloads.evaluation import evaluate
    from workloads.retrieval.bm25 import BM25Params, retrieve

    collection = resolve_collection(args.dataset)
    queries = collection.split_queries(args.split)
    params = BM25Params(k1=args.k1, b=args.b)
    run, run_path = retrieve(collection, queries, k=args.k, params=params)
    evaluation = evaluate(run, collection.split_qrels(args.split), collection.relevance_level)
    if args.json:
        print(json.dumps({
            "dataset": args.dataset, "split": args.split, "k": args.k, "k1": args.k1, "b": args.b,
            "queries": evaluation.num_queries, "relevance_level": evaluation.relevance_level,
            "run": str(run_path), "metrics": evaluation.aggregate,
        }, indent=2))
    else:
        print(f"BM25 (k1={args.k1}, b={args.b}) top-{args.k} on {args.dataset} {args.split}: "
              f"{evaluation.num_queries} queries, binary relevance >= {evaluation.relevance_level}")
        print(_metrics_table([("BM25", evaluation.aggregate)]))
        print(f"run: {run_path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.config import load_spec
    from orchestrator.run_trial import run_trial
    from orchestrator.tracking import Tracker, resolve_tracking_uri
    from workloads.spec import TrialSpec

    spec = load_spec(Path(args.config), TrialSpec)
    tracker = Tracker(resolve_tracking_uri(args.tracking_uri))
    storage = Path(args.storage).resolve()
    report = run_trial(spec, tracker, storage, ray_address=args.address, force=args.force)
    m = report.metrics
    pick = lambda prefix: {k.removeprefix(prefix): v for k, v in m.items() if k.startswith(prefix)}  # noqa: E731
    if args.json:
        print(json.dumps({
            "trial": spec.name, "mlflow_run_id": report.run_id, "tracking_uri": tracker.uri, "reused": report.reused,
            "best_epoch": report.best_epoch,
            "validation": {"bm25": pick("bm25_val_"), "model": pick("best_val_")},
            "test": {"bm25": pick("bm25_test_"), "model": pick("test_")},
            "timings": {k: m[k] for k in ("prepare_seconds", "train_seconds_per_epoch", "train_wall_seconds",
                                          "test_seconds", "trial_seconds") if k in m},
        }, indent=2))
    else:
        print(f"trial {spec.name}: MLflow run {report.run_id} ({tracker.uri}){' [reused]' if report.reused else ''}")
        print(_metrics_table([
            ("validation  BM25", pick("bm25_val_")),
            (f"validation  model (epoch {report.best_epoch})", pick("best_val_")),
            ("test        BM25", pick("bm25_test_")),
            ("test        model", pick("test_")),
        ]))
        if "train_seconds_per_epoch" in m:
            print(f"training {m['train_seconds_per_epoch']:.0f}s/epoch, trial {m['trial_seconds']:.0f}s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrate", description="rerank-lab: neural re-ranking experiments")
    sub = parser.add_subparsers(dest="command", required=True)

    bm25 = sub.add_parser("bm25", help="BM25 first stage (Pyserini) on a collection split, with its metrics")
    bm25.add_argument("--dataset", required=True, help="beir/<name>, a directory, or an ir_datasets id")
    bm25.add_argument("--split", default="test")
    bm25.add_argument("--k", type=int, default=1000, help="hits per query (default 1000)")
    bm25.add_argument("--k1", type=float, default=0.9)
    bm25.add_argument("--b", type=float, default=0.4)
    bm25.add_argument("--json", action="store_true", help="machine-readable output")
    bm25.set_defaults(func=cmd_bm25)

    run = sub.add_parser("run", help="run one trial (train, validate, test) and track it in MLflow")
    run.add_argument("config", help="trial YAML, e.g. search_spaces/trial-scifact.yaml")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite in .orchestrate/)")
    run.add_argument("--storage", default=".orchestrate/ray_results", help="Ray Train storage path for checkpoints")
    run.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    run.add_argument("--force", action="store_true", help="rerun even if a finished run of this trial exists")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from orchestrator.execution import set_offline_environment

    set_offline_environment()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
