"""The chaos benchmark: one small sweep run once without faults (the reference), then once per
seed of benchmarks/_chaos.py's fault schedule (a SIGKILL of the driver, of a Tune trial process
and of a Ray Train worker at seeded moments, a full disk at a seeded write, each followed by a
rerun of the same `orchestrate sweep`), every outcome compared with the reference. Writes, per
fault type, how often it was injected, how often the grid recovered, and how often each check
held, to benchmarks/results/chaos.json, and prints the table (docs/performance.md).

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/chaos.py [--seeds 10] [--first-seed 0] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _in_process import tiny_model  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402

from benchmarks._chaos import (  # noqa: E402
    CHECKS,
    FAULT_KINDS,
    Sweep,
    chaos_grid,
    clean_run,
    compare,
    differences,
    faulted_run,
    half_written,
    outcome,
    outside_snapshot,
    schedule,
    unexpected_exits,
    untouched,
)

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
           "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
           "RAY_ADDRESS": "local"}  # a Ray of each sweep's own: never a cluster `ray start` runs on this machine


def table(seeds: list[dict]) -> tuple[dict, str]:
    """Per fault type: injected, recovered, and each check's count among the seeds it was injected in."""
    rows = {}
    for kind in FAULT_KINDS:
        hit = [s for s in seeds if any(f["kind"] == kind and f["injected"] for f in s["faults"])]
        rows[kind] = {"scheduled": sum(any(f["kind"] == kind for f in s["faults"]) for s in seeds), "injected": len(hit),
                      **{check: sum(s["checks"][check] for s in hit) for check in CHECKS}}
    # one column per fault type, one row per check: "held / injected"
    lines = ["| | " + " | ".join(FAULT_KINDS) + " |", "|---" * (len(FAULT_KINDS) + 1) + "|",
             "| injected / scheduled | " + " | ".join(f"{rows[k]['injected']}/{rows[k]['scheduled']}" for k in FAULT_KINDS) + " |"]
    lines += [f"| {check} | " + " | ".join(f"{rows[k][check]}/{rows[k]['injected']}" for k in FAULT_KINDS) + " |" for check in CHECKS]
    return rows, "\n".join(lines)


def rescore(root: Path, previous: dict) -> list[dict]:
    """The seeds of an earlier call (``previous``: its JSON) checked again by today's checks, from
    their stores and logs as they were left (the outside check as it was taken then)."""
    expected = outcome(Sweep(root / "reference" / "chaos.yaml", root / "reference", shared_cache=root / "cache"))
    seeds = []
    for seed in previous["seeds"]:
        work = root / f"seed-{seed['seed']}"
        sweep = Sweep(work / "chaos.yaml", work, shared_cache=root / "cache")
        log = [{**run, "stderr_tail": (work / f"run{run['run']}.err").read_text()[-600:]} for run in seed["runs"]]
        runs = {"runs": log, "final_rc": log[-1].get("rc"), "unexpected_exits": unexpected_exits(log)}
        got = outcome(sweep)
        checks = compare(expected, got, sweep, runs, seed["checks"]["nothing_outside_touched"])
        seeds.append({**seed, "checks": checks, "differences": differences(expected, got)})
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workdir", help="where to run (default: a new temporary folder); one with a finished "
                                          "reference run reuses it")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "chaos.json"))
    parser.add_argument("--rescore", action="store_true", help="check the seeds of --out's earlier call in --workdir again")
    args = parser.parse_args()
    if args.rescore:
        seeds = rescore(Path(args.workdir), json.loads(Path(args.out).read_text()))
        rows, text = table(seeds)
        print(text)
        write_results(args.out, args, work=args.workdir, per_fault=rows, seeds=seeds)
        return
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    data = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "scifact"
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="chaos-"))
    reused = (root / "reference" / "mlflow.db").exists()  # a finished reference of an earlier call, kept
    model = root / "tiny-bert" if reused else tiny_model(root / "tiny-bert")
    (root / "reference").mkdir(exist_ok=True)
    # one cache for every run, as a user's repeated sweeps share theirs: each seed's runs meet
    # the writes left once the grid's data is prepared (trials' in-epoch saves, evaluations)
    cache = root / "cache"
    reference = Sweep(chaos_grid(root / "reference" / "chaos.yaml", model), root / "reference", shared_cache=cache)
    started = time.perf_counter()
    if not reused and clean_run(reference) != 0:
        raise SystemExit(f"the reference run failed: see {root / 'reference' / 'run0.err'}")
    expected = outcome(reference)
    print(f"reference: {time.perf_counter() - started:.0f} s, {len(expected['keys'])} runs", flush=True)
    seeds = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        work = root / f"seed-{seed}"
        work.mkdir()  # a seed's folder of an earlier call is never mixed into this one
        sweep, faults = Sweep(chaos_grid(work / "chaos.yaml", model), work, shared_cache=cache), schedule(seed)
        before, leftovers = outside_snapshot(work, None, data), half_written(cache)
        started = time.perf_counter()
        runs = faulted_run(sweep, faults)
        got = outcome(sweep)
        checks = compare(expected, got, sweep, runs, untouched(before, outside_snapshot(work, None, data)), leftovers)
        seeds.append({"seed": seed, "seconds": round(time.perf_counter() - started, 1), "faults": [asdict(f) for f in faults],
                      "checks": checks, "differences": differences(expected, got),
                      "runs": [{k: v for k, v in r.items() if k != "stderr_tail"} for r in runs["runs"]]})
        held = "all held" if all(checks.values()) else "FAILED: " + ", ".join(c for c, ok in checks.items() if not ok)
        print(f"seed {seed}: {[(f.kind, f.moment, f.injected) for f in faults]} {len(runs['runs'])} runs, "
              f"{seeds[-1]['seconds']:.0f} s, {held}", flush=True)
        rows, text = table(seeds)
        write_results(args.out, args, work=str(root), per_fault=rows, seeds=seeds)  # after each seed: a long run keeps what ended
    print(text)


if __name__ == "__main__":
    main()
