"""What a grid costs with and without per-cell pruning, measured on a real small sweep.

The same sweep (SciFact, MiniLM-L6, 100 pairs, a pointwise baseline and two contrastive
cells, 5 Optuna trials per cell, 3 epochs per trial, the learning rate searched over a wide log range so
that some trials are poor) runs twice in one invocation, each in its own storage and MLflow
store: ``search.pruner: none`` (exhaustive) and ``median`` (or ``--pruner``). The sweep name,
hence every cell key and every cell's sampler seed, is the same in both, so the first trials
of each cell sample the same hyper-parameters (TPE's start-up trials; later ones may differ
because pruned trials report less).

Reported per variant: compute-seconds (the trials' wall times summed: the CPU- or GPU-time a
cluster is billed for, one worker per trial), the sweep's wall time, trials complete and
pruned, and each cell's best validation nDCG@10; then the ratio of compute and the change of
each cell's best. Prints a table and writes JSON.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/sweep_cost.py [--trials 5] [--epochs 3] [--size 100] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])


def sweep_file(directory: Path, pruner: str, args) -> Path:
    sweep = {
        "name": "sweep-cost",
        "base": {
            "data": {"collection": "beir/scifact", "validation_queries": 20},
            "first_stage": {"train_depth": 50, "validation_depth": 10, "test_depth": 5},
            "optimization": {"epochs": args.epochs, "batch_size": 16, "eval_batch_size": 64},
            "resources": {"workers": 1, "cpus_per_worker": args.cpus_per_trial},
        },
        "grid": {"models": [args.model], "max_length": 128,
                 "losses": [{"ranking": "pointwise", "contrastive": "scl"}, {"ranking": "pointwise", "contrastive": "ctriplet"}],
                 "augmentations": [{"method": "none"}], "sizes": [args.size], "seeds": [13]},
        "search": {"trials_per_cell": args.trials, "sampler_seed": 13, "pruner": pruner,
                   **({"pruner_startup_trials": args.startup} if args.startup is not None else {}),
                   "learning_rate": {"low": 1.0e-6, "high": 1.0e-3, "log": True},
                   "lambda": {"low": 0.1, "high": 0.7}, "tau": {"low": 0.05, "high": 0.5, "log": True},
                   "contrastive_margin": {"low": 0.2, "high": 1.0}},
        "max_failures": 0,
    }
    path = directory / f"sweep-cost-{pruner}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def run_variant(pruner: str, directory: Path, args) -> dict:
    import mlflow
    import optuna

    from orchestrator.core import schema

    config = sweep_file(directory, pruner, args)
    storage, uri = directory / f"storage-{pruner}", f"sqlite:///{directory / f'mlflow-{pruner}.db'}"
    done = directory / f"wall-{pruner}.json"  # written once the variant finished: a rerun reuses it
    if not done.exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(config), "--storage", str(storage),
                        "--tracking-uri", uri, "-q"], check=True, cwd=REPO, env=dict(os.environ))
        done.write_text(json.dumps({"wall_seconds": time.perf_counter() - started}))
    wall = json.loads(done.read_text())["wall_seconds"]
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("sweep-cost")
    runs = client.search_runs([experiment.experiment_id], max_results=10_000)
    trials = [r for r in runs if r.data.tags.get(schema.KIND_TAG) == schema.TRIAL]
    cells = {}
    for study in optuna.get_all_study_summaries(f"sqlite:///{storage / 'sweep-cost' / 'optuna.db'}"):
        loaded = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{storage / 'sweep-cost' / 'optuna.db'}")
        complete = [t for t in loaded.trials if t.state == optuna.trial.TrialState.COMPLETE]
        cells[study.study_name] = {
            "best_val_ndcg_at_10": max(t.value for t in complete) if complete else None,
            "complete": len(complete),
            "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in loaded.trials),
            "epochs_trained": sum(len(t.intermediate_values) for t in loaded.trials),
        }
    return {
        "pruner": pruner, "wall_seconds": wall,
        "compute_seconds": sum(r.data.metrics.get(schema.TIME_TRIAL, 0.0) for r in trials),
        "trials_complete": sum(r.info.status == "FINISHED" for r in trials),
        "trials_pruned": sum(r.info.status == "KILLED" for r in trials),
        "cells": cells,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--trials", type=int, default=5, help="Optuna trials per cell")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size", type=int, default=100, help="training pairs")
    parser.add_argument("--cpus-per-trial", type=float, default=2)
    parser.add_argument("--pruner", default="median", choices=["median", "hyperband"])
    parser.add_argument("--startup", type=int, default=None, help="search.pruner_startup_trials (default: the default)")
    parser.add_argument("--workdir", default=None, help="keep the sweeps here (default: a temporary directory)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "sweep_cost.json"))
    args = parser.parse_args()

    if args.workdir:  # kept: a rerun with the same --workdir reuses a finished variant
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        variants = [run_variant(pruner, Path(args.workdir), args) for pruner in ("none", args.pruner)]
    else:
        with tempfile.TemporaryDirectory(prefix="sweep-cost-") as tmp:
            variants = [run_variant(pruner, Path(tmp), args) for pruner in ("none", args.pruner)]
    exhaustive, pruned = variants
    ratio = pruned["compute_seconds"] / exhaustive["compute_seconds"]
    print(f"\nsweep: {args.model}, SciFact {args.size} pairs, 3 cells x {args.trials} trials x {args.epochs} epochs")
    print(f"{'pruner':<10}{'compute s':>11}{'wall s':>9}{'complete':>10}{'pruned':>8}")
    for v in variants:
        print(f"{v['pruner']:<10}{v['compute_seconds']:>11.0f}{v['wall_seconds']:>9.0f}{v['trials_complete']:>10}"
              f"{v['trials_pruned']:>8}")
    print(f"compute with pruning / exhaustive: {ratio:.2f}x")
    print(f"{'cell':<24}{'best val (none)':>16}{f'best val ({args.pruner})':>20}{'change':>9}{'epochs trained':>17}")
    losses = {}
    for key, cell in exhaustive["cells"].items():
        other = pruned["cells"].get(key, {})
        change = (other.get("best_val_ndcg_at_10") or 0) - (cell["best_val_ndcg_at_10"] or 0)
        losses[key] = change
        print(f"{key:<24}{cell['best_val_ndcg_at_10'] or 0:>16.4f}{other.get('best_val_ndcg_at_10') or 0:>20.4f}"
              f"{change:>+9.4f}{cell['epochs_trained']:>8} / {other.get('epochs_trained', 0)}")
    write_results(args.out, args, variants=variants, compute_ratio=ratio, best_change_per_cell=losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
