"""Where a cross-encoder starts to learn on SciFact: one trial per training size, and its cost.

For each size in ``--sizes`` one trial like search_spaces/trials/trial-scifact.yaml (MiniLM-L6,
pointwise loss, 50 validation queries carved from train, the BM25-interpolation weight tuned
on validation) runs through the project's own path: a derived trial file per size in the work
directory, ``orchestrate run FILE --json`` on a private Ray, then ``orchestrate compare RUN``
for the fused ranking against its BM25 (the paired t 95% interval over the 300 test queries,
the report's statistics). Per size: test nDCG@10 of the cross-encoder alone, fused and BM25,
fused - BM25 with its interval, training seconds per epoch, the trial's wall seconds, training
pairs per second, and the load average and the machine's busy share while it ran (this is a
shared machine: say so beside the timings). A timing pair follows once the curve reaches its size
(``--timing-size`` pairs, one epoch, fp32 then bf16, in this process with the trial's own loop and
two threads, no Ray and no test): what each precision costs per epoch, training and validation.

Sizes run cheapest first and the JSON is rewritten after each trial, so partial results exist
early; a rerun with the same ``--workdir`` reuses the finished trials (their MLflow runs).

    ORCHESTRATE_DATA_DIR=/path/to/data nice -n 10 python benchmarks/learning_curve.py \
        [--sizes 250 500 1000 2000] [--precision bf16] [--epochs 2] [--max-length 256] [--test-depth 20] \
        [--timing-size 500] [--workdir DIR] [--out benchmarks/results/learning_curve.json]
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

from _in_process import train_in_process  # noqa: E402  (benchmarks/ is sys.path[0])
from _machine import cpu_seconds  # noqa: E402
from _results import write_results  # noqa: E402

BASE_TRIAL = REPO / "search_spaces" / "trials" / "trial-scifact.yaml"
METRIC = "ndcg_at_10"


def trial_config(name: str, size: int, epochs: int, precision: str, args) -> dict:
    """trial-scifact.yaml with this size, epochs, precision, max_length and test depth."""
    trial = yaml.safe_load(BASE_TRIAL.read_text())
    trial["name"] = name
    trial["training_data"]["size"] = size
    trial["model"]["max_length"] = args.max_length
    trial["first_stage"]["test_depth"] = args.test_depth
    trial["optimization"] |= {"epochs": epochs, "precision": precision}
    return trial


def trial_file(workdir: Path, name: str, size: int, epochs: int, precision: str, args) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(trial_config(name, size, epochs, precision, args), sort_keys=False))
    return path


def orchestrate(*arguments: str, env: dict) -> dict:
    """``orchestrate ARGUMENTS --json``'s answer (its log goes to this terminal's stderr)."""
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", *arguments, "--json"], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"orchestrate {arguments[0]} failed (exit {done.returncode}): see the lines above")
    return json.loads(done.stdout)


def steps(sizes: list[int], timing_size: int) -> list[tuple[str, int | str]]:
    """The order of the work: the curve's sizes smallest first (partial results early), the
    fp32/bf16 timing pair once the curve has reached its size (none when it is 0)."""
    plan: list[tuple[str, int | str]] = [("curve", size) for size in sorted(sizes)]
    if timing_size:
        at = sum(size <= timing_size for size in sizes)
        plan[at:at] = [("timing", "fp32"), ("timing", "bf16")]
    return plan


def run_trial(workdir: Path, name: str, size: int, epochs: int, precision: str, args) -> dict:
    """One trial end to end, its comparison with BM25, its cost and the machine's load meanwhile."""
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    config = trial_file(workdir, name, size, epochs, precision, args)
    load_before, (busy_before, idle_before) = os.getloadavg()[0], cpu_seconds()
    started = time.perf_counter()
    # A private Ray in its own temp directory: never joins (or collides with) another Ray on this machine;
    # short, under /tmp (Ray's socket paths must fit in 107 characters), removed once the trial's Ray is gone
    with tempfile.TemporaryDirectory(prefix="lc-ray-", ignore_cleanup_errors=True) as ray_temp:
        env = dict(os.environ, RAY_TMPDIR=ray_temp)
        result = orchestrate("run", str(config), "--storage", str(workdir / "storage"), "--tracking-uri", uri,
                             "--address", "local", env=env)
    wall = time.perf_counter() - started
    busy, idle = (after - before for after, before in zip(cpu_seconds(), (busy_before, idle_before)))
    run_id = result["mlflow_run_id"]
    compared = orchestrate("compare", f"{run_id}:bm25", run_id, "--tracking-uri", uri, env=dict(os.environ))  # B - A = fused - BM25
    primary = next(m for m in compared["measures"] if m["metric"] == METRIC)
    test, timings = result["test"], result["timings"]
    if abs(primary["b"] - test["model"][METRIC]) > 1e-9:  # the difference must be the fused ranking's minus BM25's
        raise SystemExit(f"orchestrate compare's B is {primary['b']}, the trial's fused {test['model'][METRIC]}")
    per_epoch = timings["train_seconds_per_epoch"]
    return {
        "name": name, "size": size, "epochs": epochs, "precision": precision, "max_length": args.max_length,
        "test_depth": args.test_depth, "mlflow_run_id": result["mlflow_run_id"], "reused": result["reused"],
        "best_epoch": result["best_epoch"], "interpolation_weight": result.get("interpolation_weight"),
        "test_queries": compared["queries"],
        "bm25": test["bm25"][METRIC], "fused": test["model"][METRIC],
        "cross_encoder": test.get("cross_encoder", test["model"])[METRIC],
        "fused_minus_bm25": primary["difference"], "ci_low": primary["ci_low"], "ci_high": primary["ci_high"],
        "p_value": primary["p_value"],
        "train_seconds_per_epoch": per_epoch, "pairs_per_second": size / per_epoch,
        "trial_seconds": timings["trial_seconds"],
        # a reused trial ran in an earlier invocation: this one's wall and load are only its look-up's
        "wall_seconds": None if result["reused"] else wall,
        "load_average_1m": None if result["reused"] else [load_before, os.getloadavg()[0]],
        "machine_busy_share": None if result["reused"] or busy + idle <= 0 else busy / (busy + idle),
    }


def time_epoch(precision: str, args) -> dict:
    """One epoch of ``--timing-size`` pairs in ``precision`` in this process (the trial's own loop,
    no Ray, no test): training and validation seconds, the load meanwhile. Data are prepared
    (and cached) before the clock starts."""
    import torch

    from workloads.kinds.rerank.spec import TrialSpec
    from workloads.kinds.rerank.steps import prepare_trial

    spec = TrialSpec.model_validate(trial_config(f"lc-timing-{precision}", args.timing_size, 1, precision, args))
    prepared = prepare_trial(spec)
    torch.set_num_threads(int(spec.resources.cpus_per_worker))  # as the trial's one Ray worker does
    load_before, (busy_before, idle_before) = os.getloadavg()[0], cpu_seconds()
    epochs, wall = train_in_process(spec, prepared.training)
    busy, idle = (after - before for after, before in zip(cpu_seconds(), (busy_before, idle_before)))
    train, validation = epochs[0]["epoch_train_seconds"], epochs[0]["epoch_validation_seconds"]
    scored = spec.data.validation_queries * spec.first_stage.validation_depth
    return {"precision": precision, "size": args.timing_size, "max_length": args.max_length,
            "train_seconds_per_epoch": train, "pairs_per_second": args.timing_size / train,
            "validation_seconds": validation, "scored_pairs_per_second": scored / validation, "wall_seconds": wall,
            "load_average_1m": [load_before, os.getloadavg()[0]],
            "machine_busy_share": busy / (busy + idle) if busy + idle > 0 else None}


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'size':>6}{'prec':>6}{'ep':>4}{'BM25':>8}{'CE':>8}{'fused':>8}{'w':>6}{'fused-BM25':>12}{'95% interval':>20}"
          f"{'s/epoch':>9}{'pairs/s':>9}{'wall s':>8}{'load':>11}")
    for r in rows:
        weight = "-" if r["interpolation_weight"] is None else f"{r['interpolation_weight']:.2f}"
        interval = f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
        load = "reused" if r["load_average_1m"] is None else f"{r['load_average_1m'][0]:.1f}-{r['load_average_1m'][1]:.1f}"
        wall = r["trial_seconds"] if r["wall_seconds"] is None else r["wall_seconds"]
        print(f"{r['size']:>6}{r['precision']:>6}{r['epochs']:>4}{r['bm25']:>8.4f}{r['cross_encoder']:>8.4f}{r['fused']:>8.4f}"
              f"{weight:>6}{r['fused_minus_bm25']:>+12.4f}{interval:>20}{r['train_seconds_per_epoch']:>9.1f}"
              f"{r['pairs_per_second']:>9.2f}{wall:>8.0f}{load:>11}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[250, 500, 1000, 2000],
                        help="training pairs per trial (none: only the timing pair)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "auto"], help="of the curve's trials")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=256, help="tokens per query-document pair")
    parser.add_argument("--test-depth", type=int, default=20, help="BM25 candidates re-ranked per test query")
    parser.add_argument("--timing-size", type=int, default=500, help="pairs of the fp32/bf16 timing pair (0: none)")
    parser.add_argument("--workdir", default=str(REPO / "benchmarks" / "results" / "learning_curve"),
                        help="trial files, MLflow store and checkpoints: kept, a rerun reuses finished trials")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "learning_curve.json"))
    args = parser.parse_args()
    if any(size < 2 for size in args.sizes) or args.epochs < 1 or args.timing_size < 0:
        parser.error("--sizes must be at least 2 pairs, --epochs at least 1, --timing-size at least 0")

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    plan = steps(args.sizes, args.timing_size)
    curve, timing = [], []
    for step, value in plan:
        if step == "curve":
            name = f"lc-{args.precision}-{value}x{args.epochs}-len{args.max_length}-top{args.test_depth}"
            curve.append(run_trial(workdir, name, value, args.epochs, args.precision, args))
        else:
            timing.append(time_epoch(value, args))
        complete = len(curve) + len(timing) == len(plan)
        speedup = timing[0]["train_seconds_per_epoch"] / timing[1]["train_seconds_per_epoch"] if len(timing) == 2 else None
        write_results(args.out, args, complete=complete, curve=curve, timing=timing, bf16_training_speedup=speedup)
    print_rows(f"learning curve ({args.precision}, {args.epochs} epochs, {args.max_length} tokens, test top {args.test_depth}; "
               "timings on a shared machine: see load)", curve)
    if timing:
        print(f"\nfp32 vs bf16: {args.timing_size} pairs, 1 epoch, in this process (no Ray), one after the other")
        print(f"{'precision':<10}{'train s':>9}{'pairs/s':>9}{'validation s':>14}{'scored/s':>10}{'load':>11}{'busy':>6}")
        for t in timing:
            load = f"{t['load_average_1m'][0]:.1f}-{t['load_average_1m'][1]:.1f}"
            print(f"{t['precision']:<10}{t['train_seconds_per_epoch']:>9.1f}{t['pairs_per_second']:>9.2f}"
                  f"{t['validation_seconds']:>14.1f}{t['scored_pairs_per_second']:>10.2f}{load:>11}{t['machine_busy_share']:>6.2f}")
        if len(timing) == 2:
            print(f"bf16 training speed-up: {speedup:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
