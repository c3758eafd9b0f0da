"""What a fresh Tune process per sweep trial costs against reusing finished trials' processes.

The sweep's own Tune trial function (``orchestrator.sweep.tune._sweep_trial``: the trial's
Ray Train fit, reported to Tune) runs the same trial ``--trials`` times, ``--concurrent`` at
a time, under two Tune settings side by side in one local Ray: ``reuse_actors=False`` (Tune's
default: every trial starts a process that imports Ray Train, torch and our modules) and
``reuse_actors=True`` (what ``orchestrate sweep`` uses: the next trial runs in a finished
trial's process). Data preparation is done once before either. Every trial is the same spec,
so every trial must end with the same validation nDCG@10. One unreported trial runs first,
so that neither variant pays for what the first trial on a machine builds (the tokenized
pairs, the OS's file cache). Prints a table and writes JSON.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/tune_processes.py [--trials 6] [--concurrent 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])


def run_variant(spec, storage: Path, trials: int, concurrent: int, reuse: bool, name: str | None = None) -> dict:
    import ray.tune

    from orchestrator.core.schema import OBJECTIVE, TIME_OVERHEAD, TIME_STARTUP, TIME_TRAIN_WALL
    from orchestrator.sweep.tune import _sweep_trial

    name = name or ("reused" if reuse else "fresh")
    config = {"spec": spec.model_dump(mode="json"), "cell": "bench", "storage": str(storage),
              "train_run": ray.tune.grid_search([f"{name}-{i}" for i in range(trials)])}
    started = time.perf_counter()
    results = ray.tune.Tuner(
        ray.tune.with_resources(_sweep_trial, {"cpu": 0, "memory": 64 * 1024**2}),  # as the sweep reserves
        param_space=config,
        tune_config=ray.tune.TuneConfig(max_concurrent_trials=concurrent, reuse_actors=reuse),
        run_config=ray.tune.RunConfig(name=f"tune-{name}", storage_path=str(storage), verbose=0),
    ).fit()
    wall = time.perf_counter() - started
    finals = [r.metrics for r in results if r.metrics and r.metrics.get("final")]
    if len(finals) != trials:
        raise SystemExit(f"{name}: {len(finals)} of {trials} trials finished")

    def mean(key: str) -> float:
        return sum(m[key] for m in finals) / len(finals)

    return {"variant": name, "reuse_actors": reuse, "trials": trials, "wall_seconds": wall,
            "wall_per_trial_seconds": wall * concurrent / trials,
            "processes": len({m["pid"] for m in finals}),
            "mean_function_seconds": mean("time_total_s"),  # Tune: the trial function, start to end
            "mean_train_wall_seconds": mean(TIME_TRAIN_WALL),  # the Ray Train fit within it
            "mean_overhead_seconds": mean(TIME_OVERHEAD), "mean_startup_seconds": mean(TIME_STARTUP),
            "val_ndcg_at_10": sorted({round(m[OBJECTIVE], 6) for m in finals})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--size", type=int, default=100, help="training pairs")
    parser.add_argument("--trials", type=int, default=6, help="trials per variant")
    parser.add_argument("--concurrent", type=int, default=2, help="trials at a time (one CPU each)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "tune_processes.json"))
    args = parser.parse_args()

    from orchestrator.core.execution import init_ray, set_environment_defaults
    from workloads.kinds.rerank.spec import TrialSpec
    from workloads.kinds.rerank.steps import prepare_trial

    set_environment_defaults()
    spec = TrialSpec.model_validate({  # the demo's trial shape (search_spaces/demo.yaml), no augmentation
        "name": "bench-tune-processes", "seed": 13,
        "data": {"collection": "beir/scifact", "validation_queries": 20},
        "first_stage": {"train_depth": 50, "validation_depth": 10, "test_depth": 10},
        "training_data": {"size": args.size, "seed": 13},
        "model": {"name": args.model, "max_length": 128},
        "optimization": {"epochs": 1, "batch_size": 16, "eval_batch_size": 32},
        "resources": {"workers": 1, "cpus_per_worker": 1},
    })
    prepare_trial(spec)  # cached by content: every trial below finds it
    init_ray(None)
    rows = []
    with tempfile.TemporaryDirectory() as storage:
        run_variant(spec, Path(storage), 1, 1, False, name="warm-up")
        for reuse in (False, True):
            rows.append(run_variant(spec, Path(storage), args.trials, args.concurrent, reuse))
    ratio = rows[1]["wall_seconds"] / rows[0]["wall_seconds"]
    print(f"{args.trials} trials, {args.concurrent} at a time: {args.model}, {args.size} SciFact pairs, 1 epoch, "
          f"1 worker of 1 CPU, max_length 128")
    print(f"{'Tune processes':<16}{'wall s':>8}{'s/trial':>9}{'processes':>11}{'function s':>12}{'fit s':>8}"
          f"{'overhead s':>12}{'start-up s':>12}  val nDCG@10")
    for row in rows:
        print(f"{row['variant']:<16}{row['wall_seconds']:>8.1f}{row['wall_per_trial_seconds']:>9.1f}{row['processes']:>11}"
              f"{row['mean_function_seconds']:>12.1f}{row['mean_train_wall_seconds']:>8.1f}"
              f"{row['mean_overhead_seconds']:>12.1f}{row['mean_startup_seconds']:>12.1f}  "
              f"{', '.join(f'{v:.4f}' for v in row['val_ndcg_at_10'])}")
    print(f"reused / fresh wall time: {ratio:.2f}x "
          f"({(rows[0]['wall_per_trial_seconds'] - rows[1]['wall_per_trial_seconds']):.1f} s less per trial slot)")
    write_results(args.out, args, rows=rows, reused_over_fresh_wall_ratio=ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
