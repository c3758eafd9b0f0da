"""What a Ray Train V2 fit costs before a trial's first line: time, CPU and processes.

Every trial of ours is a ``TorchTrainer`` fit. This runs fits of an empty training function
(it imports torch, as every trial does, and reports once), ``--concurrent`` at a time as the
demo runs its trials, each submitted from a Ray task that stands in for a sweep's Tune trial
process. For each variant, in a local Ray of its own started as ``orchestrate`` starts one:
the seconds from submission to the function's first line and to the end of the fit, the
machine's busy core-seconds per fit (from /proc/stat over the timed fits, time stolen by the
hypervisor left out; an idle Ray's own background work included), and the actors each fit
started, by class (Ray's State API). First, what an idle local Ray takes of the machine (a
minute, from 45 s after it started).
Variants: Ray's defaults, and the raylet allowed to start ``--startup-concurrency`` worker
processes at once (``RAY_worker_maximum_startup_concurrency``; Ray's default is the number
of CPUs), alternating, each twice. One untimed fit first in each. Prints a table, writes JSON.

    python benchmarks/train_fit_cost.py [--rounds 3] [--concurrent 2] [--startup-concurrency 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _machine import cpu_seconds  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402

CONCURRENCY_ENV = "RAY_worker_maximum_startup_concurrency"


def empty_loop(config):
    import time

    import ray.train
    import torch  # noqa: F401  (every trial imports torch before its first line)

    Path(config["first_line_file"]).write_text(str(time.time() - config["submitted"]))
    ray.train.report({"done": 1})


def fit_once(storage: str, name: str) -> dict:
    """One empty fit of one worker of one CPU: seconds to its first line and to its end."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    submitted = time.time()
    first_line_file = Path(storage) / f"{name}.first-line"
    TorchTrainer(empty_loop, train_loop_config={"submitted": submitted, "first_line_file": str(first_line_file)},
                 scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name=name, storage_path=storage)).fit()
    return {"first_line_seconds": float(first_line_file.read_text()), "fit_seconds": time.time() - submitted}


def busy_core_seconds() -> float:
    """CPU time this machine's processes have run (all cores), steal left out."""
    return cpu_seconds()[0]


def idle_ray_share(settle: float = 45.0, window: float = 60.0) -> float:
    """Fraction of the machine's CPU time an idle local Ray takes, ``settle`` s after it started."""
    import ray

    from orchestrator.core.execution import init_ray

    init_ray(None)
    try:
        time.sleep(settle)
        before = busy_core_seconds()
        time.sleep(window)
        return (busy_core_seconds() - before) / (window * os.cpu_count())
    finally:
        ray.shutdown()


def run_variant(name: str, rounds: int, concurrent: int, startup_concurrency: int | None) -> dict:
    import ray
    from ray.util.state import list_actors

    from orchestrator.core.execution import init_ray

    if startup_concurrency is None:
        os.environ.pop(CONCURRENCY_ENV, None)
    else:
        os.environ[CONCURRENCY_ENV] = str(startup_concurrency)  # read by the raylet init_ray starts
    init_ray(None)
    submit = ray.remote(num_cpus=0)(fit_once)
    fits = []
    try:
        with tempfile.TemporaryDirectory() as storage:
            ray.get(submit.remote(storage, "warm-up"))  # untimed: the first fit pays for what later ones reuse
            warm_actors = Counter(a.class_name for a in list_actors(limit=10_000))
            busy_before, started = busy_core_seconds(), time.perf_counter()
            for round_ in range(rounds):
                fits += ray.get([submit.remote(storage, f"r{round_}-{i}") for i in range(concurrent)])
            wall = time.perf_counter() - started
            busy = busy_core_seconds() - busy_before
            actors = Counter(a.class_name for a in list_actors(limit=10_000)) - warm_actors
    finally:
        ray.shutdown()
        os.environ.pop(CONCURRENCY_ENV, None)
    n = len(fits)
    return {"variant": name, "startup_concurrency": startup_concurrency, "fits": n, "wall_seconds": wall,
            "first_line_seconds": sum(f["first_line_seconds"] for f in fits) / n,
            "fit_seconds": sum(f["fit_seconds"] for f in fits) / n,
            "busy_core_seconds_per_fit": busy / n,
            "actors_per_fit": {k: v / n for k, v in sorted(actors.items())}, "each_fit": fits}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of --concurrent fits")
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--startup-concurrency", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "train_fit_cost.json"))
    args = parser.parse_args()

    from orchestrator.core.execution import set_environment_defaults

    set_environment_defaults()
    idle_share = idle_ray_share()
    print(f"idle local Ray: {idle_share:.1%} of the machine", flush=True)
    rows = []
    for _ in range(2):
        for name, concurrency in (("Ray's defaults", None), (f"start-up concurrency {args.startup_concurrency}",
                                                              args.startup_concurrency)):
            rows.append(run_variant(name, args.rounds, args.concurrent, concurrency))
            print(f"{name}: first line {rows[-1]['first_line_seconds']:.1f} s, fit {rows[-1]['fit_seconds']:.1f} s, "
                  f"{rows[-1]['busy_core_seconds_per_fit']:.1f} busy core-s per fit", flush=True)

    print(f"\nempty TorchTrainer fits, {args.concurrent} at a time, {os.cpu_count()} CPUs (means per fit); "
          f"an idle local Ray takes {idle_share:.1%} of the machine")
    print(f"{'variant':<28}{'fits':>5}{'first line s':>14}{'fit s':>8}{'busy core-s':>13}  actors per fit")
    for r in rows:
        actors = ", ".join(f"{k} {v:g}" for k, v in r["actors_per_fit"].items())
        print(f"{r['variant']:<28}{r['fits']:>5}{r['first_line_seconds']:>14.1f}{r['fit_seconds']:>8.1f}"
              f"{r['busy_core_seconds_per_fit']:>13.1f}  {actors}")
    write_results(args.out, args, cpus=os.cpu_count(), idle_ray_share=idle_share, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
