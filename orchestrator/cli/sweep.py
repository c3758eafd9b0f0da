"""``orchestrate sweep``: run (or resume) a sweep, or ``--dry-run`` it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_address, add_storage, add_tracking, bounded, emit
from workloads.core.errors import InputError


def add_parser(sub, common) -> None:
    parser = sub.add_parser("sweep", help="run (or resume) a sweep: the grid x Optuna x Ray Tune x MLflow", parents=[common],
                            formatter_class=HelpFormatter)
    parser.add_argument("config", help="sweep YAML, e.g. search_spaces/demo.yaml")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the cells, trial and run counts, what is done and what would stop the sweep; "
                             "run and write nothing")
    parser.add_argument("--device", metavar="PROFILE",
                        help="--dry-run: estimate compute with this throughput profile (cpu-2core, a10g, a100, h100 or "
                             "one from --throughput; default a10g for a grid with use_gpu: true, else cpu-2core)")
    parser.add_argument("--throughput", metavar="FILE", type=Path,
                        help="--dry-run: a YAML of throughput profiles (name: {model, tokens, train_pairs_per_second, "
                             "score_pairs_per_second}), e.g. measured on your GPUs")
    parser.add_argument("--price-per-hour", type=bounded(float, 0.0, what="a price (USD per device-hour, >= 0)"), metavar="USD",
                        help="--dry-run: a device-hour's price, for the cost")
    parser.add_argument("--max-concurrent", type=bounded(int, 1, what="a number of trials"), metavar="N",
                        help="trials in flight at once (overrides search.max_concurrent_trials; default: what the cluster "
                             "holds at its largest, by the autoscaler's limits; needed where those cannot be read: Ray "
                             "Client, a driver off the head, KubeRay)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    add_storage(parser)
    add_address(parser)
    parser.set_defaults(func=run)


# options only the dry run's compute estimate reads -> their argparse names
DRY_RUN_ONLY = {"--device": "device", "--throughput": "throughput", "--price-per-hour": "price_per_hour"}


def run(args: argparse.Namespace) -> int:
    from orchestrator.core.cluster_python import check_driver_python
    from orchestrator.core.ray_address import check_ray_address
    from orchestrator.core.tracking import check_tracking_uri, open_tracker
    from orchestrator.sweep.dry_run import dry_run
    from orchestrator.sweep.grid import load_sweep
    from orchestrator.sweep.runner import run_sweep
    from orchestrator.sweep.store import claim_store, sweep_paths

    given = [option for option, value in DRY_RUN_ONLY.items() if getattr(args, value) is not None]
    if given and not args.dry_run:  # the estimate is the dry run's: a sweep that runs would ignore them
        raise InputError("/".join(given), "estimate the compute of a dry run: add --dry-run (a sweep that runs uses none)")
    sweep = load_sweep(args.config)
    paths = sweep_paths(sweep, Path(args.storage))
    if args.dry_run:
        check_driver_python(args.address, dry_run=True)  # a cluster's Python is the driver's: said before a sweep starts
        report = dry_run(sweep, paths, args.device, args.throughput, args.price_per_hour)
    else:
        # Every check that can refuse comes before the first write: a Ray address that does not
        # answer or a storage that cannot be written leaves no MLflow store behind.
        from orchestrator.core.staging import require_staged
        from orchestrator.sweep.grid import sweep_specs

        require_staged(sweep_specs(sweep), args.config)  # an unknown index name, a file the workers cannot read
        joins = check_ray_address(args.address)  # the cluster running here when none is named
        check_driver_python(joins or "local")
        check_tracking_uri(args.tracking_uri)
        claim_store(paths.root, sweep.name)  # created and marked; a user's folder of the sweep's name is refused
        tracker = open_tracker(args.tracking_uri)
        report = run_sweep(sweep, tracker, Path(args.storage), ray_address=args.address, verbose=args.verbose,
                           max_concurrent=args.max_concurrent, on_finished=log_default_report)
    if args.json:
        emit(json.dumps(report, indent=2))
    else:
        print_plan(report)
    return 0


def log_default_report(sweep, tracker) -> None:
    """The finished sweep's report (the default table, its figures) on the sweep run, where the
    MLflow UI shows it; ``orchestrate report`` writes there only when asked (``--log``)."""
    import tempfile

    from orchestrator.report.build import ReportRequest, build_report
    from orchestrator.report.tables import TableOptions
    from workloads.core.logs import get_logger

    try:
        with tempfile.TemporaryDirectory() as out:
            build_report([sweep], tracker, Path(out), ReportRequest(options=TableOptions(), log_to_mlflow=True))
    except InputError as exc:  # a report that cannot be made leaves the results as they are
        get_logger("sweep").warning("the sweep's report was not logged to MLflow: %s", exc)


def print_plan(report: dict) -> None:
    trials = f"{report['trials_per_cell']} trial{'s' if report['trials_per_cell'] != 1 else ''}"
    emit(f"sweep {report['sweep']}: {report['cells']} cells ({report['baseline_cells']} baselines), "
         f"{trials} per cell -> {report['trials_planned']} trial runs, "
         f"{report['mlflow_runs_planned']} MLflow runs (sweep + cells + trials"
         f"{' + selectors' if report['selectors'] else ''})")
    if report["unavailable_cells"]:
        reasons = "; ".join(f"{n} cells: {why}" for why, n in report["unavailable_reasons"].items())
        emit(f"unavailable: {report['unavailable_cells']} cells ({reasons})")
    counts = (f"{report['runnable_cells']} cells, {report['trials_runnable']} trials; done {report['trials_done']}, "
              f"to run {report['trials_to_run']}")
    if report.get("preflight"):  # the real sweep refuses before it computes: nothing is runnable as things stand
        emit(f"runnable now: none: {len(report['preflight'])} problem(s) below would stop the sweep (once they are "
             f"solved: {counts})")
    else:
        emit(f"runnable now: {counts}")
    if report["selectors"]:
        emit(f"selectors: {len(report['selectors'])} (trained once each, before the cells that use them; "
             f"{report['selectors_to_train']} to train)")
        for s in report["selectors"]:
            emit(f"  {s['name']:<28}{s['method']:<11}{s['model'][:25]:<26}{s['size']:>7} pairs (data: {s['data']}, "
                 f"k {s['k']})  {s['cells']} cells  {'trained' if s['trained'] else 'to train'}")
    if report.get("ear_trials"):
        emit(f"EAR trials: {len(report['ear_trials'])} (the cells re-rank what they retrieve; trained once each, first; "
             f"{report['ear_trials_to_train']} to train)")
        for e in report["ear_trials"]:
            emit(f"  {e['name']:<28}{e['reranker'].upper():<11}{e['model'][:25]:<26}{e['expansion']:>22}  {e['cells']} cells  "
                 f"{'trained' if e['trained'] else 'to train'}")
    for problem in report.get("preflight", []):
        emit(f"would stop the sweep before it computes: {problem}")
    axes = ("model", "loss", "augmentation", "size", "seed")  # a kind's grid has some of them: "-" for the others
    cells = [{**dict.fromkeys(axes, "-"), **c} for c in report["cells_detail"]]
    width = max([22, *(len(c["loss"]) + 2 for c in cells)])
    aug_width = max([13, *(len(c["augmentation"]) + 2 for c in cells)])
    emit(f"{'cell':<22}{'model':<26}{'loss':<{width}}{'augmentation':<{aug_width}}{'size':>7}{'seed':>6}{'done':>6}{'best':>8}"
         "  searched / status")
    for c in cells:
        status = c["unavailable"] or ", ".join(n.rstrip("_") for n in c["searched"])
        best = f"{c['best']:.4f}" if c["best"] is not None else "-"
        emit(f"{c['key']:<22}{c['model'][:25]:<26}{c['loss']:<{width}}{c['augmentation']:<{aug_width}}{c['size']:>7}"
             f"{c['seed']:>6}{c['trials_done']:>6}{best:>8}  {status}")
    if report.get("estimate"):
        print_estimate(report["estimate"])


def _span(low: float, high: float, unit: str = "") -> str:
    return f"{unit}{low:,.0f}-{unit}{high:,.0f}" if high >= 10 else f"{unit}{low:,.1f}-{unit}{high:,.1f}"


def print_estimate(estimate: dict) -> None:
    profile = estimate["profile"]
    cost = ""
    if estimate["cost"] is not None:
        cost = f"; at ${estimate['price_per_hour']:g}/h: ${estimate['cost']:,.0f} ({_span(*estimate['cost_range'], '$')})"
    emit(f"estimated compute of the {estimate['trials']} trials to run: {estimate['device_hours']:,.1f} device-hours on "
         f"{profile['name']}, {profile['status']}, range {_span(*estimate['device_hours_range'])} (training "
         f"{estimate['train_hours']:,.1f}, validation and test {estimate['evaluation_hours']:,.1f}){cost}")
    spread = f"; rates x{profile['range'][0]:g}-{profile['range'][1]:g}" if profile.get("range") else "; no range given"
    emit(f"  throughput: {profile['model']} at {profile['tokens']} tokens, {profile['train_pairs_per_second']:g} training and "
         f"{profile['score_pairs_per_second']:g} scoring pairs/s per worker, {profile['status']}{spread} ({profile['source']})")
    if estimate.get("profiles"):
        emit("  per GPU profile: " + "; ".join(
            f"{p['name']} ({p['status']}) {p['device_hours']:,.0f} h ({_span(*p['device_hours_range'])})" for p in estimate["profiles"]))
    groups: dict[tuple[str, str], float] = {}
    for cell in estimate["cells"]:
        key = (cell["axes"].get("model", "?"), str(cell["axes"].get("size", "?")))
        groups[key] = groups.get(key, 0.0) + cell["hours"]
    for (model, size), hours in sorted(groups.items(), key=lambda kv: -kv[1])[:12]:
        emit(f"  {model[:30]:<31}size {size:>7}: {hours:,.1f} h")
    if len(groups) > 12:
        emit(f"  ... {len(groups) - 12} more (model, size) groups in --json")
    for model, source in estimate["model_shapes"].items():
        if source.startswith("assumed"):
            emit(f"  {model}: {source}")
    if estimate["cells_with_unknown_sizes"]:
        emit(f"  {len(estimate['cells_with_unknown_sizes'])} cell(s) counted in part: a size is not known before preparing "
             "(size: full, a validation split without validation_cap, a test set that is not local)")
    emit("  assumptions: " + "; ".join(estimate["assumptions"]))
