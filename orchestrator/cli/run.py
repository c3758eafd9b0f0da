"""``orchestrate run``: the trials of a trial file, each end to end and tracked in MLflow."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_address, add_tracking, emit, metrics_table
from workloads.errors import InputError

# first_stage.method -> a row label
FIRST_STAGE_NAMES = {"bm25": "BM25", "rm3": "BM25+RM3", "given": "given order", "run": "run file", "scoreddocs": "shipped run",
                     "ear": "EAR"}


def add_parser(sub, common) -> None:
    parser = sub.add_parser("run", help="run the trials of a file (train, validate, test), each tracked in MLflow",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", help="trial YAML, e.g. search_spaces/trials/trial-scifact.yaml or rq1-scifact.yaml")
    parser.add_argument("--trial", help="run only this trial of a multi-trial file")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the file and print each trial's resolved configuration, identity and targets; run nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    parser.add_argument("--storage", default=".orchestrate/ray_results", metavar="DIR", help="Ray Train storage for checkpoints")
    add_address(parser)
    parser.add_argument("--force", action="store_true", help="rerun even if a finished run of this trial exists")
    parser.set_defaults(func=run)


def selected_trials(args: argparse.Namespace):
    from orchestrator.core.config import load_trials, read_yaml
    from workloads.expansion.kind import EarTrialSpec, is_ear_file
    from workloads.spec import TrialSpec

    data, _ = read_yaml(Path(args.config))
    experiment, specs = load_trials(Path(args.config), EarTrialSpec if is_ear_file(data) else TrialSpec)
    if getattr(args, "trial", None):
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


def dry_run(config: str, experiment: str, specs, as_json: bool) -> int:
    """What ``run`` would do, checked (models, collections, held-out targets) but not run."""
    from orchestrator.core import schema
    from orchestrator.core.lifecycle import preflight_trial, target_overlap, targets

    plans = []
    for spec in specs:
        would_stop = preflight_trial(spec)
        for target in targets(spec):  # held out, by configuration and by the queries of local collections
            try:
                problem = target_overlap(spec, target)
            except InputError as exc:  # a split that cannot be read: the trial would stop on it
                would_stop.append(str(exc))
                break
            if problem is not None:
                raise InputError(f"{config}: trial {spec.name}", problem + ": a test must be held out (choose another "
                                                                           "split or collection)")
        plans.append({"trial": spec.name, "trial_key": schema.trial_key(spec), "axes": schema.axes(spec),
                      "targets": [t.name for t in targets(spec)], "would_stop": list(dict.fromkeys(would_stop)),
                      "config": spec.model_dump(mode="json", by_alias=True)})
    if as_json:
        emit(json.dumps({"experiment": experiment, "trials": plans}, indent=2))
        return 0
    for plan in plans:
        emit(f"trial {plan['trial']} (identity {plan['trial_key']}): targets {', '.join(plan['targets'])}")
        for problem in plan["would_stop"]:
            emit(f"  would stop before it computes: {problem}")
        import yaml

        emit("  " + yaml.safe_dump(plan["config"], sort_keys=False).replace("\n", "\n  ").rstrip())
    return 0


def run(args: argparse.Namespace) -> int:
    from orchestrator.core import schema
    from orchestrator.core.execution import check_ray_address
    from orchestrator.core.interrupts import Interrupted, interruptible
    from orchestrator.core.lifecycle import run_trial
    from orchestrator.core.tracking import open_tracker

    experiment, specs = selected_trials(args)
    ear = getattr(specs[0], "kind", None) == "ear"
    from orchestrator.core.lifecycle import refuse_configuration_problems

    refuse_configuration_problems(specs, args.config)  # what can never run: refused, dry run or not, before any work
    if args.dry_run:
        return (ear_dry_run if ear else dry_run)(args.config, experiment, specs, args.json)
    check_ray_address(args.address)  # before the first write: a dead address leaves no store behind
    if ear:
        from workloads.kinds import kind_of

        if args.force:
            raise InputError("--force", "an EAR trial's result is kept in the cache and shared by every trial that reads "
                                        "it: remove its directory (orchestrate run --dry-run names it) to train it again")
        for spec in specs:  # known good before the store is opened
            if kind_of(spec).finished(spec) is None:
                kind_of(spec).prepare(spec)
    tracker = open_tracker(args.tracking_uri)
    storage = Path(args.storage).resolve()
    if ear:
        return run_ear(args, experiment, specs, tracker, storage)
    results = []
    for spec in specs:
        with interruptible():  # SIGTERM as Ctrl-C: the trial's run is marked interrupted, never left open
            try:
                result = run_trial(spec, tracker, storage, ray_address=args.address, force=args.force,
                                   experiment=experiment)
            except KeyboardInterrupt:
                raise Interrupted(f"trial {spec.name} stopped before it finished (its MLflow run, once started, is "
                                  f"KILLED and tagged interrupted; {len(results)} finished trial(s) of this file are "
                                  "kept): run the same command again to resume from its last checkpoint") from None
        test = result.tests[schema.TEST]
        results.append({
            "trial": spec.name, "mlflow_run_id": result.run_id, "reused": result.reused, "best_epoch": result.best_epoch,
            "axes": schema.axes(spec), "validation": _ranking_json(result.validation), "test": _ranking_json(test),
            "timings": {k.removeprefix("time_"): v for k, v in result.timings.items()},
            **({"interpolation_weight": test.weight} if test.weight is not None else {}),
        })
        if not args.json:
            _print_trial(spec, result, results[-1], experiment, tracker)
    if args.json:
        emit(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "trials": results} if len(results) > 1
                        else {"experiment": experiment, "tracking_uri": tracker.uri, **results[0]}, indent=2))
    elif len(results) > 1:
        emit(metrics_table([(f"test {FIRST_STAGE_NAMES[specs[0].first_stage.method]}", results[0]["test"]["bm25"])]
                           + [(r["trial"].removeprefix(f"{experiment}.")[:28], r["test"]["model"]) for r in results]))
    if not args.json and any(spec.robustness for spec in specs):
        from orchestrator.report.robustness import trials_robustness
        from orchestrator.report.tables import render_markdown

        emit(render_markdown(trials_robustness(tracker, experiment, specs, [r["mlflow_run_id"] for r in results])))
    return 0


def _print_trial(spec, result, printed: dict, experiment: str, tracker) -> None:
    from orchestrator.core import schema

    test = result.tests[schema.TEST]
    emit(f"trial {spec.name}: MLflow run {result.run_id} in experiment '{experiment}' ({tracker.uri})"
         f"{' [reused]' if result.reused else ''}")
    fused = test.weight is not None
    model_label = f"model (w = {test.weight:.2f})" if fused else "model"
    first = FIRST_STAGE_NAMES[spec.first_stage.method]
    rows = [(f"validation  {first}", printed["validation"]["bm25"]), (f"validation  {model_label}", printed["validation"]["model"])]
    rows += [("validation  cross-encoder", printed["validation"].get("cross_encoder", {}))] if fused else []
    rows += [(f"test        {first}", printed["test"]["bm25"]), (f"test        {model_label}", printed["test"]["model"])]
    rows += [("test        cross-encoder", printed["test"]["cross_encoder"])] if fused else []
    how = "tuned on validation" if spec.reranking.interpolation == "tuned" else "fixed"
    emit(f"chosen epoch {result.best_epoch}" + (
        f"; model = w * cross-encoder + (1 - w) * BM25 (per-query min-max), w {how}" if fused else ""))
    emit(metrics_table(rows))
    if schema.TIME_PER_EPOCH in result.timings:
        emit(f"training {result.timings[schema.TIME_PER_EPOCH]:.0f}s/epoch, trial {result.timings[schema.TIME_TRIAL]:.0f}s\n")


# ----------------------------------------------------------------------------- EAR trial files


def ear_dry_run(config: str, experiment: str, specs, as_json: bool) -> int:
    """What ``run`` would do with EAR trials, checked (model, collection, expansion source) but not run."""
    from orchestrator.core.lifecycle import ear_preflight
    from workloads.expansion.kind import ear_dir, ear_key

    plans = [{"trial": spec.name, "kind": "ear", "trial_key": ear_key(spec), "kept_in": str(ear_dir(spec)),
              "would_stop": ear_preflight(spec), "config": spec.model_dump(mode="json")} for spec in specs]
    if as_json:
        emit(json.dumps({"experiment": experiment, "trials": plans}, indent=2))
        return 0
    import yaml

    for plan in plans:
        emit(f"EAR trial {plan['trial']} (identity {plan['trial_key']}): kept in {plan['kept_in']}")
        for problem in plan["would_stop"]:
            emit(f"  would stop before it computes: {problem}")
        emit("  " + yaml.safe_dump(plan["config"], sort_keys=False).replace("\n", "\n  ").rstrip())
    return 0


def run_ear(args: argparse.Namespace, experiment: str, specs, tracker, storage: Path) -> int:
    """Each EAR trial trained once (reused when kept), tracked as a run of kind ``ear``, then its
    test comparison: BM25, RM3, the first expansion, all concatenated, EAR, the oracle."""
    from orchestrator.core.execution import check_resources, init_ray
    from orchestrator.core.interrupts import Interrupted, interruptible
    from orchestrator.core.lifecycle import ensure_requirement
    from workloads.expansion.comparison import ear_comparison
    from workloads.kinds import kind_of

    results = []
    for spec in specs:
        with interruptible():
            try:
                if kind_of(spec).finished(spec) is None:
                    init_ray(args.address)
                    check_resources(spec)  # a worker no node can hold would wait forever
                kept = ensure_requirement(spec, tracker, tracker.experiment_id(experiment), storage, args.address)
            except KeyboardInterrupt:
                raise Interrupted(f"EAR trial {spec.name} stopped before it finished (its MLflow run, once started, is "
                                  f"KILLED and tagged interrupted; {len(results)} finished trial(s) of this file are "
                                  "kept): run the same command again to resume from its last checkpoint") from None
        rows = ear_comparison(spec)
        results.append({"trial": spec.name, "kept_in": str(kept), "queries": rows[0].evaluation.num_queries,
                        "systems": {r.name: {"metrics": r.evaluation.aggregate, "p_value_vs_bm25": r.p_vs_bm25,
                                             "p_value_vs_rm3": r.p_vs_rm3} for r in rows}})
        if not args.json:
            emit(f"EAR trial {spec.name}: {rows[0].evaluation.num_queries} test queries, {spec.expansion.n} "
                 f"{spec.expansion.source} expansions each; kept in {kept}")
            emit(metrics_table([(r.label, r.evaluation.aggregate) for r in rows]))
            ear = next(r for r in rows if r.name.startswith("ear-"))
            emit(f"{ear.label} nDCG@10 against BM25 p={ear.p_vs_bm25:.3g}, against BM25+RM3 p={ear.p_vs_rm3:.3g} "
                 "(paired t-test)\n")
    if args.json:
        emit(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "trials": results}, indent=2))
    return 0
