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


def _selected_trials(args: argparse.Namespace):
    from orchestrator.config import load_trials
    from workloads.spec import TrialSpec

    experiment, specs = load_trials(Path(args.config), TrialSpec)
    if args.trial:
        chosen = [s for s in specs if s.name in (args.trial, f"{experiment}.{args.trial}")]
        if not chosen:
            names = ", ".join(s.name.removeprefix(f"{experiment}.") for s in specs)
            raise InputError(args.config, f"no trial '{args.trial}' (trials: {names})")
        specs = chosen
    return experiment, specs


def _pick(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.run_trial import run_trial
    from orchestrator.tracking import Tracker, resolve_tracking_uri

    experiment, specs = _selected_trials(args)
    tracker = Tracker(resolve_tracking_uri(args.tracking_uri))
    storage = Path(args.storage).resolve()
    results = []
    for spec in specs:
        report = run_trial(spec, tracker, storage, ray_address=args.address, force=args.force, experiment=experiment)
        m = report.metrics
        results.append({
            "trial": spec.name, "mlflow_run_id": report.run_id, "reused": report.reused, "best_epoch": report.best_epoch,
            "axes": spec.axes(),
            "validation": {"bm25": _pick(m, "bm25_val_"), "model": _pick(m, "best_val_")},
            "test": {"bm25": _pick(m, "bm25_test_"), "model": _pick(m, "test_")},
            "timings": _pick(m, "time_"),
        })
        if not args.json:
            r = results[-1]
            print(f"trial {spec.name}: MLflow run {report.run_id} in experiment '{experiment}' ({tracker.uri})"
                  f"{' [reused]' if report.reused else ''}")
            print(_metrics_table([
                ("validation  BM25", r["validation"]["bm25"]),
                (f"validation  model (epoch {report.best_epoch})", r["validation"]["model"]),
                ("test        BM25", r["test"]["bm25"]),
                ("test        model", r["test"]["model"]),
            ]))
            if "time_train_seconds_per_epoch" in m:
                print(f"training {m['time_train_seconds_per_epoch']:.0f}s/epoch, trial {m['time_trial_seconds']:.0f}s\n")
    if args.json:
        print(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "trials": results} if len(results) > 1
                         else {"experiment": experiment, "tracking_uri": tracker.uri, **results[0]}, indent=2))
    elif len(results) > 1:
        print(_metrics_table([("test BM25", results[0]["test"]["bm25"])]
                             + [(r["trial"].removeprefix(f"{experiment}.")[:28], r["test"]["model"]) for r in results]))
    return 0


def cmd_augment(args: argparse.Namespace) -> int:
    import textwrap

    import pyarrow.parquet as pq

    from workloads.trial import prepare_trial

    _, specs = _selected_trials(args)
    specs = [s for s in specs if s.augmentation.method != "none"]
    if not specs:
        raise InputError(args.config, "no trial with augmentation (augmentation.method is none)")
    for spec in specs:
        prepared = prepare_trial(spec)
        rows = pq.read_table(prepared.training.training_set).to_pylist()
        augmented = pq.read_table(prepared.training.augmentation).to_pylist()
        print(f"== {spec.name}: {spec.augmentation.method}, k_a = {spec.augmentation.k}, {len(augmented)} rows "
              f"({prepared.training.augmentation})")
        width = max(40, (args.width - 7) // 2)
        for row, aug in list(zip(rows, augmented))[: args.show]:
            print(f"\nquery: {row['query']}")
            original = textwrap.wrap(row["positive"][:args.chars] + ("..." if len(row["positive"]) > args.chars else ""), width)
            selected = textwrap.wrap(aug["augmented_positive"], width)
            print(f"{'original d+ (' + row['positive_id'] + ')':<{width}} | augmented d+_a "
                  f"({aug['sentences_kept']} of {aug['sentences_total']} sentences)")
            for i in range(max(len(original), len(selected))):
                left = original[i] if i < len(original) else ""
                right = selected[i] if i < len(selected) else ""
                print(f"{left:<{width}} | {right}")
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

    run = sub.add_parser("run", help="run the trials of a file (train, validate, test), each tracked in MLflow")
    run.add_argument("config", help="trial YAML, e.g. search_spaces/trial-scifact.yaml or rq1-scifact.yaml")
    run.add_argument("--trial", help="run only this trial of a multi-trial file")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite in .orchestrate/)")
    run.add_argument("--storage", default=".orchestrate/ray_results", help="Ray Train storage path for checkpoints")
    run.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    run.add_argument("--force", action="store_true", help="rerun even if a finished run of this trial exists")
    run.set_defaults(func=cmd_run)

    augment = sub.add_parser("augment", help="build (or reuse) a trial's augmentations and show examples")
    augment.add_argument("config", help="trial YAML with augmentation")
    augment.add_argument("--trial", help="only this trial of a multi-trial file")
    augment.add_argument("--show", type=int, default=3, help="examples to print (default 3)")
    augment.add_argument("--chars", type=int, default=600, help="characters of the original document shown")
    augment.add_argument("--width", type=int, default=120, help="output width")
    augment.set_defaults(func=cmd_augment)
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
