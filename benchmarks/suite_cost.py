"""What a test run costs the machine, and which processes it starts: the census behind the
suite's wall time (docs/development.md, "Where the suite's time goes").

Runs ``python -m pytest -q -p no:cacheprovider PYTEST_ARGS`` and, every ``--interval``
seconds while it runs, reads /proc/stat (busy and idle jiffies of the whole machine,
hypervisor steal left out) and the process table: every Ray worker process by the class its
title names (``ray::TrainController``, ``ray::RayTrainWorker``, ...; a pooled worker shows
``ray::IDLE`` until it becomes one), Anserini's JVMs and fresh ``orchestrate`` interpreters,
each counted once by pid. Prints wall seconds, busy core-seconds, the share of all cores used
and the census; writes JSON. Processes shorter than the interval can be missed, so the counts
are lower bounds. Run it on a quiet machine:

    python benchmarks/suite_cost.py [--interval 0.5] [--out benchmarks/results/suite_cost.json] -- -m slow
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _machine import cpu_seconds  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402

RAY_TITLE = re.compile(r"^ray::([A-Za-z_]+)")


def kind_of(args: str) -> str | None:
    """What a process is, for the census (None: not counted)."""
    title = RAY_TITLE.match(args)
    if title:
        return f"ray::{title.group(1)}"
    if "anserini" in args and "java" in args.split()[0]:
        return "anserini JVM"
    if "orchestrator.cli" in args:
        return "orchestrate (fresh interpreter)"
    return None


def sample(pids_by_kind: dict[str, set[int]], stop: threading.Event, interval: float) -> None:
    while not stop.is_set():
        table = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        for line in table.splitlines():
            pid, _, args = line.strip().partition(" ")
            kind = kind_of(args.strip())
            if kind:
                pids_by_kind[kind].add(int(pid))
        stop.wait(interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples of the process table")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "suite_cost.json"))
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default: the whole suite)")
    args = parser.parse_args()

    pids_by_kind: dict[str, set[int]] = defaultdict(set)
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(pids_by_kind, stop, args.interval), daemon=True)
    busy0, idle0 = cpu_seconds()
    started = time.time()
    sampler.start()
    pytest = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                            cwd=REPO, capture_output=True, text=True, env=dict(os.environ))
    wall = time.time() - started
    stop.set()
    sampler.join()
    busy1, idle1 = cpu_seconds()
    busy, idle = busy1 - busy0, idle1 - idle0
    outcome = next((line for line in reversed(pytest.stdout.splitlines()) if line.strip()), "")
    census = {kind: len(pids) for kind, pids in sorted(pids_by_kind.items(), key=lambda kv: -len(kv[1]))}
    ray_processes = len(set().union(*(pids for kind, pids in pids_by_kind.items() if kind.startswith("ray::"))))

    print(f"pytest {' '.join(args.pytest_args)}: {outcome} (exit {pytest.returncode})")
    print(f"wall {wall:.1f} s, busy {busy:.0f} core-s, {busy / (busy + idle):.1%} of {os.cpu_count()} cores")
    print(f"Ray worker processes started: {ray_processes}")
    for kind, count in census.items():
        print(f"  {count:5d}  {kind}")
    write_results(args.out, args, wall_seconds=round(wall, 1), busy_core_seconds=round(busy, 1),
                  cores_used=round(busy / (busy + idle), 3), cores=os.cpu_count(), pytest_exit=pytest.returncode,
                  pytest_outcome=outcome, ray_worker_processes=ray_processes, processes=census)
    sys.exit(pytest.returncode)


if __name__ == "__main__":
    main()
