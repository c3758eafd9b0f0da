"""``orchestrate prepare``: every trial's data of a trial file or a sweep, built without training."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from orchestrator.cli.output import HelpFormatter, emit
from workloads.core.errors import InputError


def add_parser(sub, common) -> None:
    parser = sub.add_parser("prepare", parents=[common], formatter_class=HelpFormatter,
                            help="build every trial's data (first-stage runs, training and augmentation sets, token ids, "
                                 "candidates of every target) without training; a rerun reuses what is built")
    parser.add_argument("config", help="a sweep (search_spaces/demo.yaml) or a trial file (search_spaces/trials/...)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def units_of(path: Path) -> tuple[str, list]:
    """(name, preparation units) of a sweep (a file with a ``grid``) or a trial file."""
    from orchestrator.lifecycle.preparation import trial_unit

    try:
        is_sweep = isinstance(loaded := yaml.safe_load(path.read_text()), dict) and "grid" in loaded
    except (OSError, yaml.YAMLError):
        is_sweep = False  # the loaders below say what is wrong, with the line
    if is_sweep:
        from orchestrator.sweep.dry_run import preparation_units
        from orchestrator.sweep.grid import load_sweep

        sweep = load_sweep(path)
        return sweep.name, preparation_units(sweep, sweep.cells)
    from orchestrator.cli.run import selected_trials

    experiment, specs = selected_trials(argparse.Namespace(config=str(path)))
    return experiment, [trial_unit(spec.name, [spec]) for spec in specs]


def run(args: argparse.Namespace) -> int:
    from orchestrator.lifecycle.preparation import cache_files, fetch_models, prepare_units, refuse_configuration_problems

    name, units = units_of(Path(args.config))
    if not units:
        raise InputError(args.config, "nothing to prepare: no runnable trial or cell")
    # what can never run is refused before any unit is prepared (an EAR trial over other data
    # would be prepared first, then its trial would wait for it forever)
    refuse_configuration_problems([spec for unit in units for spec in unit.specs], args.config)
    from orchestrator.core.staging import require_staged

    require_staged([spec for unit in units for spec in unit.specs], args.config)  # index names, the workers' storage
    before = cache_files()
    fetch_models(units)
    reports = prepare_units(units)
    built = cache_files() - before
    waiting = [r for r in reports if not r.complete]
    if args.json:
        emit(json.dumps({"name": name, "units": len(reports), "files_built": built, "complete": len(reports) - len(waiting),
                         "waiting": [{"unit": r.label, "for": r.waiting} for r in waiting],
                         "seconds": sum(r.seconds for r in reports)}, indent=2))
        return 0
    emit(f"{name}: {len(reports)} trial(s) or cell(s) prepared, {built} file(s) built "
         f"({'everything reused' if not built else 'the rest reused'}), {sum(r.seconds for r in reports):.1f}s")
    for report in waiting:
        emit(f"  {report.label} waits: {report.waiting}")
    return 0
