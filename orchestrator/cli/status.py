"""``orchestrate status``: a sweep's progress, read only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.cli.output import HelpFormatter, add_storage, add_tracking, emit


def add_parser(sub, common) -> None:
    parser = sub.add_parser("status", help="a sweep's progress: cells done/running/failed, best so far, ETA (reads only)",
                            parents=[common], formatter_class=HelpFormatter)
    parser.add_argument("config", help="the sweep YAML")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_tracking(parser)
    add_storage(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.core.tracking import open_tracker
    from orchestrator.sweep.grid import load_sweep
    from orchestrator.sweep.status import sweep_status

    sweep = load_sweep(args.config, "status")
    status = sweep_status(sweep, open_tracker(args.tracking_uri, write=False), Path(args.storage))
    if args.json:
        emit(json.dumps(status, indent=2))
        return 0
    stopped = "".join(f", {name} {status[f'cells_{name}']}" for name in ("stale", "interrupted") if status[f"cells_{name}"])
    emit(f"sweep {status['sweep']}: cells done {status['cells_done']}, running {status['cells_running']}, "
         f"failed {status['cells_failed']}{stopped}, pending {status['cells_pending']} (of {status['cells']}); "
         f"trials finished {status['trials_finished']}, pruned {status['trials_pruned']}, failed {status['trials_failed']}, "
         f"interrupted {status['trials_interrupted']}, running {status['trials_running']}")
    if status["cells_interrupted"] or status["trials_interrupted"]:
        emit("interrupted work resumes when the sweep runs again (the same command)")
    if status["data_unchecked"]:
        emit(status["data_unchecked"])
    if status["cells_stale"]:
        emit("stale cells were tested on data that has changed since: running the sweep again tests them again")
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
    if status["disk_trials"]:
        emit(f"checkpoints: {status['disk_bytes'] / 1e9:.2f} GB on {status['disk_trials']} trial(s), "
             f"{status['disk_per_trial_bytes'] / 1e6:.0f} MB per trial (storage.keep decides what stays)")
    for failure in status["failed_trials"]:
        emit(f"failed: {failure}")
    return 0
