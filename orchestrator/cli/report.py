"""``orchestrate report``: paper tables, significance and figures of one or more sweeps (reads only,
unless ``--log``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_storage, add_tracking, bounded, emit
from workloads.core.errors import InputError
from workloads.core.logs import get_logger

log = get_logger("orchestrate")


def add_parser(sub, common) -> None:
    from orchestrator.report.render import RENDERERS
    from orchestrator.report.tables import FAMILIES
    from workloads.evaluation.significance import CORRECTIONS, PAIRED_TESTS

    parser = sub.add_parser("report", help="paper-style tables, significance and figures of one or more sweeps",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("sweeps", nargs="+", metavar="SWEEP", help="sweep YAML(s); several for --transfer")
    parser.add_argument("--metric", default="ndcg@10", help="nDCG@10, nDCG@20, RR@10, RR@100, AP, MAP@20 or P@1")
    parser.add_argument("--rows", default="model,size", help="row axes, comma-separated")
    parser.add_argument("--cols", default="augmentation", choices=["augmentation", "loss", "model", "size"],
                        help="column axis (the other axes follow it in the column label)")
    parser.add_argument("--collection", help="test collection: the sweep's own (default) or a zero-shot one by name")
    parser.add_argument("--format", default="md", choices=list(RENDERERS), help="printed format (all three are written)")
    parser.add_argument("--test", default="t", choices=list(PAIRED_TESTS), help="paired test against the baseline")
    parser.add_argument("--correction", default="none", choices=list(CORRECTIONS),
                        help="multiple comparisons: holm, bonferroni (family-wise error) or bh (Benjamini-Hochberg, false "
                             "discovery rate), over --family")
    parser.add_argument("--family", choices=list(FAMILIES),
                        help="what --correction corrects over: each table's comparisons (default) or every system against "
                             "its baseline on every collection of the sweep")
    parser.add_argument("--measures", metavar="M1,M2",
                        help="with --family sweep: measures corrected together, e.g. ndcg@10,rr@10 (one table each; "
                             "the family is every comparison on each of them)")
    parser.add_argument("--ci", action="store_true",
                        help="t intervals of each difference against the baseline (over queries, and "
                             "seeds), queries won/tied/lost and effect sizes in the tables, error bars in the figures")
    parser.add_argument("--seeds", action="store_true", help="also each seed's value of every cell")
    parser.add_argument("--digits", type=bounded(int, 0, 12, what="a number of digits"), default=4, help="digits shown")
    parser.add_argument("--zero-shot", action="store_true", help="also the zero-shot table (collections x models, AUG Table 4)")
    parser.add_argument("--transfer", action="store_true", help="also the transfer matrix (train x test collection) of the sweeps")
    parser.add_argument("--robustness", action="store_true",
                        help="CFT's robustness table instead: MAP and P@1 clean and per perturbation (SWEEP may be a trial file)")
    parser.add_argument("--select", help="the system of the zero-shot and transfer tables, e.g. "
                                         "loss=pointwise+scl,augmentation=bm25,size=1000 "
                                         "(default: best validation nDCG@10 at the largest size)")
    parser.add_argument("--out", default=".orchestrate/reports", metavar="DIR", help="directory for tables and figures")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--log", action="store_true",
                        help="also log the files and the table to each sweep's MLflow run (a finished sweep logs its "
                             "default report there itself)")
    add_tracking(parser)
    add_storage(parser)
    parser.set_defaults(func=run)


def _open(args):
    from orchestrator.core.tracking import open_tracker

    tracker = open_tracker(args.tracking_uri, write=args.log)
    if tracker is None:
        raise InputError(args.tracking_uri or ".orchestrate/mlflow.db", "no MLflow store here: run the sweep first "
                                                                      "(or give --tracking-uri)")
    return tracker


def _check_storage(sweep, storage: str) -> None:
    from orchestrator.sweep.store import record_owner, sweep_paths

    record_owner(sweep, sweep_paths(sweep, Path(storage)).root)


def run(args: argparse.Namespace) -> int:
    from orchestrator.report.build import ReportRequest, build_report, parse_select
    from orchestrator.report.results import metric_key
    from orchestrator.report.tables import TableOptions
    from orchestrator.sweep.grid import load_sweep

    if args.robustness:
        return _robustness(args)
    sweeps = [load_sweep(path, "report") for path in args.sweeps]  # (a trial file: report --robustness reads it)
    for sweep in sweeps:
        _check_storage(sweep, args.storage)
    measures = _measures(args)
    options = TableOptions(metric=measures[0] if measures else metric_key(args.metric), test=args.test,
                           correction=args.correction, digits=args.digits, family=args.family, ci=args.ci,
                           seeds=args.seeds, measures=measures)
    request = ReportRequest(options=options, rows=tuple(a.strip() for a in args.rows.split(",") if a.strip()), cols=args.cols,
                            collection=args.collection, output_format=args.format, zero_shot=args.zero_shot,
                            transfer=args.transfer, select=parse_select(args.select), plots=not args.no_plots,
                            log_to_mlflow=args.log)
    output = build_report(sweeps, _open(args), Path(args.out), request)
    emit(output.text)
    log.info("written: %s", ", ".join(str(p) for p in output.files))
    return 0


def _measures(args: argparse.Namespace) -> tuple[str, ...]:
    """``--measures`` as metric keys, checked: a family over measures is the sweep's."""
    from orchestrator.report.results import metric_key

    if args.measures is None:
        return ()
    if args.family != "sweep":
        raise InputError("--measures", "a family over several measures needs --family sweep")
    try:
        keys = tuple(dict.fromkeys(metric_key(m) for m in args.measures.split(",") if m.strip()))
    except InputError as error:
        raise InputError("--measures", error.problem) from None
    if not keys:
        raise InputError("--measures", "no measure given (e.g. ndcg@10,rr@10)")
    return keys


def _robustness(args: argparse.Namespace) -> int:
    """``report --robustness``: a trial file's trials, or a sweep's finished cells, clean vs perturbed."""
    from orchestrator.core.config import read_yaml
    from orchestrator.report.build import load_results
    from orchestrator.report.render import RENDERERS
    from orchestrator.report.robustness import sweep_robustness, trial_file_robustness
    from orchestrator.sweep.grid import load_sweep

    tracker = _open(args)
    options = {"correction": args.correction, "family": args.family, "ci": args.ci, "show_seeds": args.seeds}
    for path in args.sweeps:
        is_sweep = "grid" in read_yaml(Path(path))[0]
        table = (sweep_robustness(load_results(load_sweep(path), tracker), args.test, **options) if is_sweep
                 else trial_file_robustness(tracker, path, args.test, **options))
        emit(RENDERERS[args.format](table, args.digits))
    return 0
