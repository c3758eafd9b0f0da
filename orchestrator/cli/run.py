"""``orchestrate run``: the trials of a trial file, each end to end and tracked in MLflow."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_address, add_tracking, emit, metrics_table
from workloads.core.errors import InputError


def add_parser(sub, common) -> None:
    parser = sub.add_parser("run", help="run the trials of a file (train, validate, test), each tracked in MLflow",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", help="trial YAML, e.g. search_spaces/trials/trial-scifact.yaml or rq1-scifact.yaml")
    parser.add_argument("--trial", help="run only this trial of a multi-trial file")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the file and print each trial's resolved configuration, identity and targets; run nothing")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    parser.add_argument("--storage", default=".orchestrate/ray_results", metavar="DIR",
                        help="Ray Train storage for checkpoints; Ray's own output goes to run.log there (-v: on the terminal)")
    add_address(parser)
    parser.add_argument("--force", action="store_true", help="rerun even if a finished run of this trial exists")
    parser.set_defaults(func=run)


def file_kind(data):
    """The kind a trial file's top level (or its ``base``) names with ``kind:``; the default kind
    where it names none the registry knows (its spec then says what is wrong with the file)."""
    from workloads.kinds import TRIAL_KINDS, kind_named

    base = data.get("base") if isinstance(data, dict) else None
    named = [data.get("kind") if isinstance(data, dict) else None, base.get("kind") if isinstance(base, dict) else None]
    return kind_named(next((name for name in named if isinstance(name, str) and name in TRIAL_KINDS), None))


def selected_trials(args: argparse.Namespace):
    from orchestrator.core.config import load_trials, read_yaml

    data, _ = read_yaml(Path(args.config))
    experiment, specs = load_trials(Path(args.config), file_kind(data).spec)
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


def _first_stage_label(spec) -> str:
    """The row label of what the model is compared with: its first stage's (``BM25``, ``EAR``)."""
    from workloads.retrieval.first_stage import FIRST_STAGES

    first_stage = getattr(spec, "first_stage", None)  # (a kind without one compares with its prepared baseline)
    return FIRST_STAGES[first_stage.method].label if first_stage is not None else "first stage"


def dry_run(config: str, experiment: str, specs, as_json: bool) -> int:
    """What ``run`` would do, checked (models, collections, held-out targets) but not run: each
    trial's identity, then where its kind keeps its result, or the targets it is tested on."""
    from orchestrator.lifecycle.preparation import preflight
    from orchestrator.lifecycle.targets import target_overlap, targets
    from workloads.kinds import kind_of

    plans = []
    for spec in specs:
        kind = kind_of(spec)
        would_stop = preflight(spec)
        plan = {"trial": spec.name}
        if kind.kept_in is not None:
            plan |= {"kind": kind.name, "trial_key": kind.key(spec), "kept_in": str(kind.kept_in(spec))}
        else:
            for target in targets(spec):  # held out, by configuration and by the queries of local collections
                try:
                    problem = target_overlap(spec, target)
                except InputError as exc:  # a split that cannot be read: the trial would stop on it
                    would_stop.append(str(exc))
                    break
                if problem is not None:
                    raise InputError(f"{config}: trial {spec.name}", problem + ": a test must be held out (choose another "
                                                                               "split or collection)")
            plan |= {"trial_key": kind.key(spec), "axes": kind.axes(spec), "targets": [t.name for t in targets(spec)]}
        plans.append(plan | {"would_stop": list(dict.fromkeys(would_stop)), "config": spec.model_dump(mode="json", by_alias=True)})
    if as_json:
        emit(json.dumps({"experiment": experiment, "trials": plans}, indent=2))
        return 0
    import yaml

    for spec, plan in zip(specs, plans):
        where = f"kept in {plan['kept_in']}" if "kept_in" in plan else f"targets {', '.join(plan['targets'])}"
        emit(f"{kind_of(spec).title} {plan['trial']} (identity {plan['trial_key']}): {where}")
        for problem in plan["would_stop"]:
            emit(f"  would stop before it computes: {problem}")
        emit("  " + yaml.safe_dump(plan["config"], sort_keys=False).replace("\n", "\n  ").rstrip())
    return 0


def run(args: argparse.Namespace) -> int:
    from orchestrator.core.execution import input_error_in
    from orchestrator.core.interrupts import Interrupted, interruptible
    from orchestrator.core.ray_address import check_ray_address
    from orchestrator.core.ray_output import RUN_LOG, ray_output_to
    from orchestrator.core.tracking import open_tracker
    from orchestrator.lifecycle.preparation import refuse_configuration_problems
    from orchestrator.lifecycle.run import run_trial
    from workloads.kinds import kind_of

    experiment, specs = selected_trials(args)
    kind = kind_of(specs[0])  # a trial file holds trials of one kind
    refuse_configuration_problems(specs, args.config)  # what can never run: refused, dry run or not, before any work
    if args.dry_run:
        return dry_run(args.config, experiment, specs, args.json)
    check_ray_address(args.address)  # before the first write: a dead address leaves no store behind
    if kind.keeps_result:  # a result kept outside the store, shared by every trial that reads it
        if args.force:
            article = "an" if kind.title[:1].lower() in "aeiou" else "a"
            raise InputError("--force", f"{article} {kind.title}'s result is kept in the cache and shared by every trial "
                                        "that reads it: remove its directory (orchestrate run --dry-run names it) to train "
                                        "it again")
        for spec in specs:  # found without the store: one not kept yet is known good before the store is opened
            if kind.finished(spec) is None:
                kind.prepare(spec)
    tracker = open_tracker(args.tracking_uri)
    storage = Path(args.storage).resolve()
    results = []
    # Ray's and Train's own lines in a file beside the checkpoints, the project's on the terminal (all there with -v)
    with ray_output_to(None if args.verbose else storage / RUN_LOG, lambda exc: input_error_in(exc) is not None):
        for spec in specs:
            with interruptible():  # SIGTERM as Ctrl-C: the trial's run is marked interrupted, never left open
                try:
                    result = run_trial(spec, tracker, storage, ray_address=args.address, force=args.force,
                                       experiment=experiment)
                except KeyboardInterrupt:
                    raise Interrupted(f"{kind.title} {spec.name} stopped before it finished (its MLflow run, once started, is "
                                      f"KILLED and tagged interrupted; {len(results)} finished trial(s) of this file are "
                                      "kept): run the same command again to resume from its last checkpoint") from None
            results.append(_reported(kind, spec, result, experiment, tracker, args.json))
    if args.json:
        listed = len(results) > 1 or kind.report is not None  # (a kind's own report always lists its trials)
        emit(json.dumps({"experiment": experiment, "tracking_uri": tracker.uri, "trials": results} if listed
                        else {"experiment": experiment, "tracking_uri": tracker.uri, **results[0]}, indent=2))
    if kind.report is None and not args.json:
        _print_comparison(specs, results, experiment, tracker)
    return 0


def _reported(kind, spec, result, experiment: str, tracker, as_json: bool) -> dict:
    """One trial's result for ``--json``, printed unless ``as_json``: what its kind reports of its
    kept result, else its run's validation and test rankings."""
    from orchestrator.core import schema

    if kind.report is not None:
        report = kind.report(spec, result.kept)
        if not as_json:
            emit(report.heading)
            emit(metrics_table(report.rows))
            for line in report.closing:
                emit(line)
        return {"trial": spec.name, **report.fields}
    test = result.tests[schema.TEST]
    printed = {
        "trial": spec.name, "mlflow_run_id": result.run_id, "reused": result.reused, "best_epoch": result.best_epoch,
        "axes": kind.axes(spec), "validation": _ranking_json(result.validation), "test": _ranking_json(test),
        "timings": {k.removeprefix("time_"): v for k, v in result.timings.items()},
        **({"interpolation_weight": test.weight} if test.weight is not None else {}),
    }
    if not as_json:
        _print_trial(spec, result, printed, experiment, tracker)
    return printed


def _print_comparison(specs, results: list[dict], experiment: str, tracker) -> None:
    """Several trials of a file side by side on their test data; their robustness, if tested."""
    if len(results) > 1:
        emit(metrics_table([(f"test {_first_stage_label(specs[0])}", results[0]["test"]["bm25"])]
                           + [(r["trial"].removeprefix(f"{experiment}.")[:28], r["test"]["model"]) for r in results]))
    if any(getattr(spec, "robustness", ()) for spec in specs):  # perturbed copies of the test queries were tested
        from orchestrator.report.render import render_markdown
        from orchestrator.report.robustness import trials_robustness

        emit(render_markdown(trials_robustness(tracker, experiment, specs, [r["mlflow_run_id"] for r in results])))


def _print_trial(spec, result, printed: dict, experiment: str, tracker) -> None:
    from orchestrator.core import schema

    test = result.tests[schema.TEST]
    emit(f"trial {spec.name}: MLflow run {result.run_id} in experiment '{experiment}' ({tracker.uri})"
         f"{' [reused]' if result.reused else ''}")
    fused = test.weight is not None
    model_label = f"model (w = {test.weight:.2f})" if fused else "model"
    first = _first_stage_label(spec)
    rows = [(f"validation  {first}", printed["validation"]["bm25"]), (f"validation  {model_label}", printed["validation"]["model"])]
    rows += [("validation  cross-encoder", printed["validation"].get("cross_encoder", {}))] if fused else []
    rows += [(f"test        {first}", printed["test"]["bm25"]), (f"test        {model_label}", printed["test"]["model"])]
    rows += [("test        cross-encoder", printed["test"]["cross_encoder"])] if fused else []
    fusion = ""
    if fused:
        how = "tuned on validation" if spec.reranking.interpolation == "tuned" else "fixed"
        fusion = f"; model = w * cross-encoder + (1 - w) * BM25 (per-query min-max), w {how}"
    emit(f"chosen epoch {result.best_epoch}{fusion}")
    emit(metrics_table(rows))
    if schema.TIME_PER_EPOCH in result.timings:
        emit(f"training {result.timings[schema.TIME_PER_EPOCH]:.0f}s/epoch, trial {result.timings[schema.TIME_TRIAL]:.0f}s\n")
