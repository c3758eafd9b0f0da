"""``orchestrate reset``: start a sweep afresh (after a bad interrupt, or changed data)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import time
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_storage, add_tracking, emit
from workloads.core.errors import InputError


def add_parser(sub, common) -> None:
    parser = sub.add_parser("reset", help="forget a sweep's trials and runs so that it starts afresh (prepared data is kept)",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", help="the sweep YAML")
    parser.add_argument("--yes", action="store_true", help="do it without asking")
    add_tracking(parser)
    add_storage(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Removes the store ``<storage>/<sweep>`` (Optuna studies, Ray checkpoints) and moves the MLflow
    experiment out of the way (renamed ``<sweep>-reset-<time>``, then deleted: MLflow keeps it
    in its trash until ``mlflow gc``), after the sweep's own lock is free. The cache (indexes,
    runs, training sets, trained selectors) stays: the restarted sweep reuses it.

    Only a store that orchestrate wrote for this sweep is removed (its marker, or for a store
    written before the marker, nothing in it but what a sweep writes): a folder of the user's
    that carries the sweep's name is one line, and nothing at all is removed."""
    from orchestrator.core.tracking import open_tracker
    from orchestrator.sweep.grid import load_sweep
    from orchestrator.sweep.store import (
        LOCK_FILE,
        MARKER,
        STORE_ENTRIES,
        check_store_owner,
        describe_foreign,
        foreign_entries,
        sweep_lock,
        sweep_paths,
    )

    sweep = load_sweep(args.config, "reset")
    paths = sweep_paths(sweep, Path(args.storage))
    tracker = open_tracker(args.tracking_uri, write=False)
    experiment = tracker.client.get_experiment_by_name(sweep.name) if tracker is not None else None
    check_store_owner(sweep, paths, tracker, experiment)  # never another file's sweep of the same name
    foreign = foreign_entries(paths.root, sweep.name)
    if foreign is not None:  # before anything is removed, the MLflow experiment included
        raise InputError(paths.root, describe_foreign(sweep.name, foreign) + "; nothing removed")
    kept = {LOCK_FILE, MARKER}  # the lock is held while removing; the marker says the folder is still the store
    stored = paths.root.exists() and any(p.name not in kept for p in paths.root.iterdir())
    if not stored and experiment is None:
        raise InputError(args.config, f"nothing to reset: no trace of sweep '{sweep.name}' in {paths.root}"
                                      + (f" or {tracker.uri}" if tracker else ""))
    what = [str(paths.root)] if stored else []
    what += [f"MLflow experiment '{sweep.name}' ({tracker.uri})"] if experiment is not None else []
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError(args.config, "reset removes " + " and ".join(what) + ": add --yes to confirm")
        answer = input(f"remove {' and '.join(what)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            emit("nothing removed")
            return 0
    locked = stored or (paths.root / MARKER).exists()  # a store (a running sweep holds its lock), never a bare folder
    with sweep_lock(paths) if locked else contextlib.nullcontext():  # never under a running sweep
        if experiment is not None:
            tracker.client.rename_experiment(experiment.experiment_id, f"{sweep.name}-reset-{int(time.time())}")
            tracker.client.delete_experiment(experiment.experiment_id)
        left = []
        if stored:
            for child in paths.root.iterdir():
                if child.name in kept:
                    continue
                if child.name not in STORE_ENTRIES:  # put there by someone else since: never ours to remove
                    left.append(child.name)
                    continue
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
            from orchestrator.sweep.search import optuna_storage

            optuna_storage.cache_clear()  # a storage this process opened points at the removed file
    emit(f"sweep {sweep.name} reset: removed {' and '.join(what)}; the next `orchestrate sweep` starts it afresh"
         + (f" (left what orchestrate did not write there: {', '.join(sorted(left))})" if left else ""))
    return 0
