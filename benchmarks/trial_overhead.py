"""What running a trial as Ray Train workers costs over the plain training loop.

The same trial (MiniLM-L6 on a small SciFact slice by default) is trained twice in one
run, side by side: once in this process with ``workloads.training.train_cross_encoder``
(no Ray), once through ``orchestrator.core.execution.train_on_ray`` (a local Ray, a
``TorchTrainer`` with one worker, checkpoints persisted by Ray). Data preparation is
done before either and shared. The overhead (wall time minus the loop's training and
validation) is broken down from the loop's own epoch metrics: start-up (Ray Train's
controller and worker group, until the loop's first line), set-up (training set, model,
tokenized pairs, optimizer), checkpoint writing, and the rest (persistence, reporting,
shut-down). Prints a table and writes JSON.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/trial_overhead.py [--size 100] [--out benchmarks/results/trial_overhead.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _in_process import train_in_process  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--size", type=int, default=100, help="training pairs")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the one worker (and torch threads in-process)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "trial_overhead.json"))
    args = parser.parse_args()

    import torch

    from orchestrator.core.execution import init_ray, set_environment_defaults, train_on_ray
    from workloads.kinds.rerank.spec import TrialSpec
    from workloads.kinds.rerank.steps import prepare_trial

    set_environment_defaults()
    spec = TrialSpec.model_validate({
        "name": "bench-overhead", "seed": 13,
        "data": {"collection": "beir/scifact", "validation_queries": 20},
        "first_stage": {"train_depth": 50, "validation_depth": 10, "test_depth": 10},
        "training_data": {"size": args.size, "seed": 13},
        "model": {"name": args.model, "max_length": 128},
        "optimization": {"epochs": args.epochs, "batch_size": 16, "eval_batch_size": 32},
        "resources": {"workers": 1, "cpus_per_worker": args.cpus},
    })
    prepared = prepare_trial(spec)  # shared by both: the comparison is the training path only

    torch.set_num_threads(args.cpus)
    epochs_plain, plain_wall = train_in_process(spec, prepared.training)

    started = time.perf_counter()
    init_ray(None)
    ray_start = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as storage:
        fit_started = time.perf_counter()
        epochs_ray = train_on_ray(spec, prepared.training, Path(storage), f"bench-{int(time.time())}")
        fit_wall = time.perf_counter() - fit_started
    ray_wall = time.perf_counter() - started

    def inner(epochs) -> float:  # training + validation seconds measured inside the loop
        return sum(e["epoch_train_seconds"] + e.get("epoch_validation_seconds", 0.0) for e in epochs)

    def parts(epochs, wall) -> dict[str, float]:  # where the overhead goes (the loop's own epoch metrics)
        found = {name: sum(e.get(f"epoch_{name}_seconds", 0.0) for e in epochs) for name in ("startup", "setup", "checkpoint")}
        found["rest"] = wall - inner(epochs) - sum(found.values())  # persistence, reporting, shut-down
        return found

    ray_epochs = [e.metrics for e in epochs_ray]
    rows = [
        {"path": "plain loop (no Ray)", "wall_seconds": plain_wall, "inner_seconds": inner(epochs_plain),
         **parts(epochs_plain, plain_wall), "val_ndcg_at_10": epochs_plain[-1]["val_ndcg_at_10"]},
        {"path": "Ray Train (1 worker)", "wall_seconds": fit_wall, "inner_seconds": inner(ray_epochs),
         **parts(ray_epochs, fit_wall), "ray_start_seconds": ray_start, "with_ray_start_seconds": ray_wall,
         "val_ndcg_at_10": ray_epochs[-1]["val_ndcg_at_10"]},
    ]
    for row in rows:
        row["overhead_seconds"] = row["wall_seconds"] - row["inner_seconds"]
    ratio = rows[1]["wall_seconds"] / rows[0]["wall_seconds"]
    print(f"trial: {args.model}, {args.size} pairs, {args.epochs} epoch(s), {args.cpus} CPUs, max_length 128")
    print(f"{'path':<24}{'wall s':>9}{'inner s':>9}{'overhead s':>12}{'start-up':>10}{'set-up':>8}{'ckpt':>7}"
          f"{'rest':>7}{'val nDCG@10':>13}")
    for row in rows:
        print(f"{row['path']:<24}{row['wall_seconds']:>9.1f}{row['inner_seconds']:>9.1f}{row['overhead_seconds']:>12.1f}"
              f"{row['startup']:>10.1f}{row['setup']:>8.1f}{row['checkpoint']:>7.1f}{row['rest']:>7.1f}"
              f"{row['val_ndcg_at_10']:>13.4f}")
    print(f"Ray Train fit / plain wall time: {ratio:.2f}x (starting the local Ray itself, once per sweep: {ray_start:.1f} s)")
    write_results(args.out, args, rows=rows, ray_over_plain_wall_ratio=ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
