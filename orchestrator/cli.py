"""The ``orchestrate`` command line.

Bad input (a malformed file, an unknown dataset, a missing field) prints one line naming
the file and the problem on stderr and exits with code 2; nothing is half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from workloads.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, MEASURES
from workloads.logs import LEVEL_ENV, get_logger
from workloads.logs import configure as configure_logging

log = get_logger("orchestrate")

EXIT_INPUT_ERROR = 2

# The command's result (a table, --json) goes to the real stdout; everything else printed in
# the process (Ray forwards worker and raylet messages to the driver's sys.stdout, at any
# time up to exit) goes to stderr, so `--json` output stays parseable.
_result_stream = sys.stdout


def emit(*parts: object) -> None:
    print(*parts, file=_result_stream, flush=True)


def _metrics_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    names = list(MEASURES)
    width = max([28] + [len(label) + 2 for label, _ in rows])
    header = f"{'':<{width}}" + "".join(f"{DISPLAY_NAMES[n]:>9}" for n in names)
    lines = [header]
    for label, metrics in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{metrics[n]:>9.4f}" if n in metrics else f"{'-':>9}" for n in names))
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
        emit(json.dumps({
            "dataset": args.dataset, "split": args.split, "k": args.k, "k1": args.k1, "b": args.b,
            "queries": evaluation.num_queries, "relevance_level": evaluation.relevance_level,
            "run": str(run_path), "metrics": evaluation.aggregate,
        }, indent=2))
    else:
        emit(f"BM25 (k1={args.k1}, b={args.b}) top-{args.k} on {args.dataset} {args.split}: "
              f"{evaluation.num_queries} queries, binary relevance >= {evaluation.relevance_level}")
        emit(_metrics_table([("BM25", evaluation.aggregate)]))
        emit(f"run: {run_path}")
    return 0


def _selected_trials(args: argparse.Namespace):
    from orchestrator.core.config import load_trials
    from workloads.spec import TrialSpec

    experiment, specs = load_trials(Path(args.config), TrialSpec)
    if args.trial:
        chosen = [s for s in specs if s.name in (args.trial, f"{experiment}.{args.trial}")]
        if not chosen:
            names = ", ".join(s.name.removeprefix(f"{experiment}.") for s in specs)
            raise InputError(args.config, f"no trial '{args.trial}' (trials: {names})")
        specs = chosen
    return experiment, specs


def _ranking_json(ranking) -> dict:
    out = {"bm25": ranking.first_stage, "model": ranking.model}
    if ranking.weight is not None:  # the final ranking fuses BM25: the cross-encoder alone beside it
        out["cross_encoder"] = ranking.cross_encoder
    return out


FIRST_STAGE_NAMES = {"bm25": "BM25", "given": "given order", "run": "run file"}  # first_stage.method -> a row label


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.core import schema
    from orchestrator.core.lifecycle import run_trial
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri

    experiment, specs = _selected_trials(args)
    tracker = Tracker(resolve_tracking_uri(args.tracking_uri))
    storage = Path(args.storage).resolve()
    results = []
    for spec in specs:
        result = run_trial(spec, tracker, storage, ray_address=args.address, force=args.force, experiment=experiment)
        test = result.tests[schema.TEST]
        results.append({
            "trial": spec.name, "mlflow_run_id": result.run_id, "reused": result.reused, "best_epoch": result.best_epoch,
            "axes": schema.axes(spec), "validation": _ranking_json(result.validation), "test": _ranking_json(test),
            "timings": {k.removeprefix("time_"): v for k, v in result.timings.items()},
            **({"interpolation_weight": test.weight} if test.weight is not None else {}),
        })
        if not args.json:
            r = results[-1]
            emit(f"trial {spec.name}: MLflow run {result.run_id} in experiment '{experiment}' ({tracker.uri})"
                 f"{' [reused]' if result.reused else ''}")
            fused = test.weight is not None
            model_label = f"model (w = {test.weight:.2f})" if fused else "model"
            first = FIRST_STAGE_NAMES[spec.first_stage.method]
            rows = [(f"validation  {first}", r["validation"]["bm25"]), (f"validation  {model_label}", r["validation"]["model"])]
            rows += [("validation  cross-encoder", r["validation"].get("cross_encoder", {}))] if fused else []
            rows += [(f"test        {first}", r["test"]["bm25"]), (f"test        {model_label}", r["test"]["model"])]
            rows += [("test        cross-encoder", r["test"]["cross_encoder"])] if fused else []
            how = "tuned on validation" if spec.reranking.interpolation == "tuned" else "fixed"
            emit(f"chosen epoch {result.best_epoch}" + (
                f"; model = w * cross-encoder + (1 - w) * BM25 (per-query min-max), w {how}" if fused else ""))
            emit(_metrics_table(rows))
            if schema.TIME_PER_EPOCH in result.timings:
                emit(f"training {result.timings[schema.TIME_PER_EPOCH]:.0f}s/epoch, trial {result.timings[schema.TIME_TRIAL]:.0f}s\n")
    if args.json:
        emit(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "trials": results} if len(results) > 1
                        else {"experiment": experiment, "tracking_uri": tracker.uri, **results[0]}, indent=2))
    elif len(results) > 1:
        emit(_metrics_table([(f"test {FIRST_STAGE_NAMES[specs[0].first_stage.method]}", results[0]["test"]["bm25"])]
                            + [(r["trial"].removeprefix(f"{experiment}.")[:28], r["test"]["model"]) for r in results]))
    if not args.json and any(spec.robustness for spec in specs):
        from orchestrator.report.robustness import trials_robustness
        from orchestrator.report.tables import render_markdown

        emit(render_markdown(trials_robustness(tracker, experiment, specs, [r["mlflow_run_id"] for r in results])))
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
        augmented = pq.read_table(prepared.training.augmentation_for(1)).to_pylist()
        emit(f"== {spec.name}: {spec.augmentation.method}, k_a = {spec.augmentation.k}, {len(augmented)} rows "
              f"({prepared.training.augmentation_for(1)})")
        width = max(40, (args.width - 7) // 2)
        for row, aug in list(zip(rows, augmented))[: args.show]:
            emit(f"\nquery: {row['query']}")
            original = textwrap.wrap(row["positive"][:args.chars] + ("..." if len(row["positive"]) > args.chars else ""), width)
            selected = textwrap.wrap(aug["augmented_positive"] or "(no sentence: no augmented pair)", width)
            emit(f"{'original d+ (' + row['positive_id'] + ')':<{width}} | augmented d+_a "
                  f"({aug['sentences_kept']} of {aug['sentences_total']} sentences)")
            for i in range(max(len(original), len(selected))):
                left = original[i] if i < len(original) else ""
                right = selected[i] if i < len(selected) else ""
                emit(f"{left:<{width}} | {right}")
    return 0


def cmd_perturb(args: argparse.Namespace) -> int:
    """A split's queries and their perturbed variants side by side (CFT's robustness sets)."""
    from workloads.collections import resolve_collection
    from workloads.perturbations import PERTURBATIONS, perturb_queries

    queries = resolve_collection(args.dataset).split_queries(args.split)
    names = args.perturbations.split(",") if args.perturbations else list(PERTURBATIONS)
    unknown = [n for n in names if n not in PERTURBATIONS]
    if unknown:
        raise InputError("--perturbations", f"unknown perturbation '{unknown[0]}' (known: {', '.join(PERTURBATIONS)})")
    variants = {name: perturb_queries(queries, name, args.seed) for name in names}
    emit(f"{args.dataset} {args.split}: {len(queries)} queries; variants: "
         + ", ".join(f"{name} {len(v)}" for name, v in variants.items()))
    for qid in list(queries)[: args.show]:
        emit(f"\n{qid}  original     {queries[qid]}")
        for name in names:
            emit(f"{'':{len(qid)}}  {name:<12} {variants[name].get(qid, '(no variant)')}")
    return 0


def _load_sweep(path: str):
    from orchestrator.sweep.grid import load_sweep

    return load_sweep(Path(path))


def _print_plan(report: dict) -> None:
    emit(f"sweep {report['sweep']}: {report['cells']} cells ({report['baseline_cells']} baselines), "
          f"{report['trials_per_cell']} trials per cell -> {report['trials_planned']} trial runs, "
          f"{report['mlflow_runs_planned']} MLflow runs (sweep + cells + trials"
          f"{' + selectors' if report['selectors'] else ''})")
    if report["unavailable_cells"]:
        reasons = "; ".join(f"{n} cells: {why}" for why, n in report["unavailable_reasons"].items())
        emit(f"unavailable: {report['unavailable_cells']} cells ({reasons})")
    emit(f"runnable now: {report['runnable_cells']} cells, {report['trials_runnable']} trials; "
          f"done {report['trials_done']}, to run {report['trials_to_run']}")
    if report["selectors"]:
        emit(f"selectors: {len(report['selectors'])} (trained once each, before the cells that use them; "
             f"{report['selectors_to_train']} to train)")
        for s in report["selectors"]:
            emit(f"  {s['name']:<28}{s['method']:<11}{s['model'][:25]:<26}{s['size']:>7} pairs (data: {s['data']}, "
                 f"k {s['k']})  {s['cells']} cells  {'trained' if s['trained'] else 'to train'}")
    for problem in report.get("preflight", []):
        emit(f"would stop the sweep before it computes: {problem}")
    width = max([22, *(len(c["loss"]) + 2 for c in report["cells_detail"])])
    header = (f"{'cell':<22}{'model':<26}{'loss':<{width}}{'augmentation':<13}{'size':>7}{'seed':>6}{'done':>6}{'best':>8}"
              "  searched / status")
    emit(header)
    for c in report["cells_detail"]:
        status = c["unavailable"] or ", ".join(n.rstrip("_") for n in c["searched"])
        best = f"{c['best']:.4f}" if c["best"] is not None else "-"
        emit(f"{c['key']:<22}{c['model'][:25]:<26}{c['loss']:<{width}}{c['augmentation']:<13}{c['size']:>7}{c['seed']:>6}"
              f"{c['trials_done']:>6}{best:>8}  {status}")


def cmd_sweep(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri
    from orchestrator.sweep.grid import check_targets, expand_grid
    from orchestrator.sweep.runner import dry_run_report, preflight, run_sweep, sweep_paths

    sweep = _load_sweep(args.config)
    paths = sweep_paths(sweep, Path(args.storage))
    if args.dry_run:
        check_targets(sweep, expand_grid(sweep))  # by the queries of local collections too; nothing is prepared
        report = {**dry_run_report(sweep, paths), "preflight": preflight(sweep)}
    else:
        tracker = Tracker(resolve_tracking_uri(args.tracking_uri))
        report = run_sweep(sweep, tracker, Path(args.storage), ray_address=args.address, verbose=args.verbose)
    if args.json:
        emit(json.dumps(report, indent=2))
    else:
        _print_plan(report)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri
    from orchestrator.sweep.runner import sweep_status

    sweep = _load_sweep(args.config)
    status = sweep_status(sweep, Tracker(resolve_tracking_uri(args.tracking_uri)), Path(args.storage))
    if args.json:
        emit(json.dumps(status, indent=2))
        return 0
    emit(f"sweep {status['sweep']}: cells done {status['cells_done']}, running {status['cells_running']}, "
          f"failed {status['cells_failed']}, pending {status['cells_pending']} (of {status['cells']}); "
          f"trials finished {status['trials_finished']}, pruned {status['trials_pruned']}, failed {status['trials_failed']}, "
          f"running {status['trials_running']}")
    if status["selectors"]:
        emit(f"selectors: {status['selectors_trained']} of {status['selectors']} trained")
        for s in status["selector_runs"]:
            measured = ", ".join(f"{label} nDCG@10 {s[key]:.4f}" for label, key in (("val", "val_ndcg_at_10"), ("test", "test_ndcg_at_10"))
                                 if s[key] is not None)
            emit(f"  {s['name']}: {s['status']}" + (f" ({measured})" if measured else ""))
    if status["best"]:
        b = status["best"]
        emit(f"best so far: {b['cell']} ({b['axes']}) val nDCG@10 {b['value']:.4f}")
    if status["eta_seconds"] is not None:
        emit(f"ETA: {status['eta_seconds'] / 60:.0f} min ({status['mean_trial_seconds']:.0f}s per trial)")
    for failure in status["failed_trials"]:
        emit(f"failed: {failure}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri
    from orchestrator.report.build import ReportRequest, build_report, parse_select
    from orchestrator.report.results import metric_key
    from orchestrator.report.tables import TableOptions

    if args.robustness:
        return _report_robustness(args)
    sweeps = [_load_sweep(path) for path in args.sweeps]
    options = TableOptions(metric=metric_key(args.metric), test=args.test, correction=args.correction, digits=args.digits)
    request = ReportRequest(options=options, rows=tuple(a.strip() for a in args.rows.split(",") if a.strip()), cols=args.cols,
                            collection=args.collection, output_format=args.format, zero_shot=args.zero_shot,
                            transfer=args.transfer, select=parse_select(args.select), plots=not args.no_plots)
    output = build_report(sweeps, Tracker(resolve_tracking_uri(args.tracking_uri)), Path(args.out), request)
    emit(output.text)
    log.info("written: %s", ", ".join(str(p) for p in output.files))
    return 0


def _report_robustness(args: argparse.Namespace) -> int:
    """``report --robustness``: a trial file's trials, or a sweep's finished cells, clean vs perturbed."""
    from orchestrator.core.config import read_yaml
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri
    from orchestrator.report.build import load_results
    from orchestrator.report.robustness import sweep_robustness, trial_file_robustness
    from orchestrator.report.tables import RENDERERS

    tracker = Tracker(resolve_tracking_uri(args.tracking_uri))
    for path in args.sweeps:
        is_sweep = "grid" in read_yaml(Path(path))[0]
        table = (sweep_robustness(load_results(_load_sweep(path), tracker), args.test) if is_sweep
                 else trial_file_robustness(tracker, path, args.test))
        emit(RENDERERS[args.format](table, args.digits))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import Tracker, resolve_tracking_uri
    from orchestrator.report.compare import compare_runs, format_comparison

    result = compare_runs(Tracker(resolve_tracking_uri(args.tracking_uri)), args.run_a, args.run_b or f"{args.run_a}:bm25",
                          collection=args.collection, test=args.test, top=args.top)
    emit(json.dumps(result, indent=2) if args.json else format_comparison(result))
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    import subprocess

    from orchestrator.core.tracking import Tracker, resolve_tracking_uri

    if args.host != "127.0.0.1" and not args.expose:
        raise InputError("--host", f"binding to {args.host} exposes the MLflow UI beyond this machine: add --expose to confirm")
    uri = resolve_tracking_uri(args.tracking_uri)
    tracker = Tracker(uri)
    for experiment in tracker.client.search_experiments():  # stores written before experiments were marked
        if experiment.name != "Default":
            tracker.experiment_id(experiment.name)  # opens on the runs table, not on a GenAI traces overview
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log.info("MLflow UI for %s on http://%s:%s", uri, args.host, args.port)
    return subprocess.call([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
                            "--host", args.host, "--port", str(args.port), "--workers", "1"], env=env)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrate", description="rerank-lab: neural re-ranking experiments")
    sub = parser.add_subparsers(dest="command", required=True)
    # Options every command takes (after the command name).
    common = argparse.ArgumentParser(add_help=False)
    verbosity = common.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="store_true",
                           help="debug messages, and Ray's and Tune's own output on the terminal")
    verbosity.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")

    bm25 = sub.add_parser("bm25", help="BM25 first stage (Pyserini) on a collection split, with its metrics", parents=[common])
    bm25.add_argument("--dataset", required=True, help="beir/<name>, a directory, or an ir_datasets id")
    bm25.add_argument("--split", default="test")
    bm25.add_argument("--k", type=int, default=1000, help="hits per query (default 1000)")
    bm25.add_argument("--k1", type=float, default=0.9)
    bm25.add_argument("--b", type=float, default=0.4)
    bm25.add_argument("--json", action="store_true", help="machine-readable output")
    bm25.set_defaults(func=cmd_bm25)

    run = sub.add_parser("run", help="run the trials of a file (train, validate, test), each tracked in MLflow", parents=[common])
    run.add_argument("config", help="trial YAML, e.g. search_spaces/trial-scifact.yaml or rq1-scifact.yaml")
    run.add_argument("--trial", help="run only this trial of a multi-trial file")
    run.add_argument("--json", action="store_true", help="machine-readable output")
    run.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite in .orchestrate/)")
    run.add_argument("--storage", default=".orchestrate/ray_results", help="Ray Train storage path for checkpoints")
    run.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    run.add_argument("--force", action="store_true", help="rerun even if a finished run of this trial exists")
    run.set_defaults(func=cmd_run)

    augment = sub.add_parser("augment", help="build (or reuse) a trial's augmentations and show examples", parents=[common])
    augment.add_argument("config", help="trial YAML with augmentation")
    augment.add_argument("--trial", help="only this trial of a multi-trial file")
    augment.add_argument("--show", type=int, default=3, help="examples to print (default 3)")
    augment.add_argument("--chars", type=int, default=600, help="characters of the original document shown")
    augment.add_argument("--width", type=int, default=120, help="output width")
    augment.set_defaults(func=cmd_augment)

    perturb = sub.add_parser("perturb", help="a split's queries and their perturbed variants side by side", parents=[common])
    perturb.add_argument("dataset", help="a collection reference, e.g. wikiqa or beir/scifact")
    perturb.add_argument("--split", default="test")
    perturb.add_argument("--show", type=int, default=5, help="queries to print (default 5)")
    perturb.add_argument("--perturbations", help="comma-separated (default: punctuation,typo,contraction)")
    perturb.add_argument("--seed", type=int, default=0, help="the perturbation seed (default 0, what trials use)")
    perturb.set_defaults(func=cmd_perturb)

    sweep = sub.add_parser("sweep", help="run (or resume) a sweep: the grid x Optuna x Ray Tune x MLflow", parents=[common])
    sweep.add_argument("config", help="sweep YAML, e.g. search_spaces/demo.yaml")
    sweep.add_argument("--dry-run", action="store_true", help="print the cells, trial and run counts, what is done; run nothing")
    sweep.add_argument("--json", action="store_true")
    sweep.add_argument("--tracking-uri")
    sweep.add_argument("--storage", default=".orchestrate/sweeps", help="sweep storage: Optuna studies, Ray checkpoints")
    sweep.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, else a local Ray)")
    sweep.set_defaults(func=cmd_sweep)

    status = sub.add_parser("status", help="a sweep's progress: cells done/running/failed, best so far, ETA", parents=[common])
    status.add_argument("config", help="the sweep YAML")
    status.add_argument("--json", action="store_true")
    status.add_argument("--tracking-uri")
    status.add_argument("--storage", default=".orchestrate/sweeps")
    status.set_defaults(func=cmd_status)

    from orchestrator.report.tables import RENDERERS
    from workloads.significance import CORRECTIONS, PAIRED_TESTS

    report = sub.add_parser("report", help="paper-style tables, significance and figures of one or more sweeps", parents=[common])
    report.add_argument("sweeps", nargs="+", metavar="SWEEP", help="sweep YAML(s); several for --transfer")
    report.add_argument("--metric", default="ndcg@10", help="nDCG@10 (default), nDCG@20, RR@10, RR@100, AP, MAP@20, P@1")
    report.add_argument("--rows", default="model,size", help="row axes (default model,size)")
    report.add_argument("--cols", default="augmentation", choices=["augmentation", "loss", "model", "size"],
                        help="column axis (default augmentation; the other axes follow it in the column label)")
    report.add_argument("--collection", help="test collection: the sweep's own (default) or a zero-shot one by name")
    report.add_argument("--format", default="md", choices=list(RENDERERS), help="printed format (all three are written)")
    report.add_argument("--test", default="t", choices=list(PAIRED_TESTS), help="paired test against the baseline (default t)")
    report.add_argument("--correction", default="none", choices=list(CORRECTIONS), help="across the table's comparisons")
    report.add_argument("--digits", type=int, default=4)
    report.add_argument("--zero-shot", action="store_true", help="also the zero-shot table (collections x models, AUG Table 4)")
    report.add_argument("--transfer", action="store_true", help="also the transfer matrix (train x test collection) of the sweeps")
    report.add_argument("--robustness", action="store_true",
                        help="CFT's robustness table instead: MAP and P@1 clean and per perturbation (SWEEP may be a trial file)")
    report.add_argument("--select", help="the system of the zero-shot and transfer tables, e.g. "
                                         "loss=pointwise+scl,augmentation=bm25,size=1000 "
                                         "(default: best validation nDCG@10 at the largest size)")
    report.add_argument("--out", default=".orchestrate/reports", help="directory for tables and figures (default .orchestrate/reports)")
    report.add_argument("--no-plots", action="store_true")
    report.add_argument("--tracking-uri")
    report.set_defaults(func=cmd_report)

    compare = sub.add_parser("compare", help="two MLflow runs (cells or tested trials), or a run and its BM25: measures, "
                                              "p-values, most changed queries", parents=[common])
    compare.add_argument("run_a", metavar="RUN_A", help="an MLflow run id (RUN:bm25 is that run's first stage)")
    compare.add_argument("run_b", metavar="RUN_B", nargs="?", help="another run id, or RUN:bm25 (default: RUN_A's own BM25)")
    compare.add_argument("--collection", help="test (default) or a zero-shot collection name")
    compare.add_argument("--test", default="t", choices=list(PAIRED_TESTS))
    compare.add_argument("--top", type=int, default=10, help="queries shown (default 10)")
    compare.add_argument("--json", action="store_true")
    compare.add_argument("--tracking-uri")
    compare.set_defaults(func=cmd_compare)

    ui = sub.add_parser("ui", help="the MLflow UI for the tracking store (127.0.0.1 unless --host and --expose)", parents=[common])
    ui.add_argument("--tracking-uri")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--expose", action="store_true", help="confirm binding to a non-loopback --host")
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    from orchestrator.core.execution import set_environment_defaults

    global _result_stream
    set_environment_defaults()
    args = build_parser().parse_args(argv)
    # For the rest of the process, exit included (Ray flushes deduplicated worker and raylet
    # messages from atexit handlers), and at the descriptor level too (native code and child
    # processes write to fd 1 directly): fd 1 becomes stderr, results go to a copy of it.
    sys.stdout.flush()
    _result_stream = os.fdopen(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    level = "DEBUG" if args.verbose else "WARNING" if args.quiet else "INFO"
    os.environ[LEVEL_ENV] = level  # Ray workers log at the driver's level
    configure_logging(level)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
