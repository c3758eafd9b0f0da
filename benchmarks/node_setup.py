"""What a worker's setup costs from the head's wheelhouse against the registry: the INSTALL step
of cluster/node-setup.sh (a venv, pip upgraded, the project installed editable with its pinned
dependencies), timed both ways on this machine (docs/cluster.md, "How a worker starts fast").

In a fresh folder (``--work``, default a new temporary one; nothing else is touched):
1. the project's tracked files at HEAD (``git archive``), as ``ray up`` copies them to a node;
2. the wheelhouse, as the head builds it: ``pip wheel`` of the project with its dependencies,
   and pip and setuptools for the editable install, with no pip cache (a fresh head has none);
3. a worker from it: ``venv``, then ``pip install --no-index --find-links WHEELHOUSE``;
4. a worker from the registry: ``venv``, then ``pip install`` with no pip cache.
Whatever pip's own configuration adds (a local ``find-links`` folder of wheels) applies to all
three: say so when reporting numbers. Each step's wall seconds and its processes' own CPU
seconds (user + system, from the kernel's accounting of finished children): on a shared machine
the wall time follows the load, the CPU time much less. ``--wheelhouse DIR`` reuses a built
one (no build), ``--registry-first`` swaps the two workers' order. Prints the seconds and
sizes; writes JSON. Run it with ``nice`` on a shared machine and say how loaded it was:

    nice -n 10 python benchmarks/node_setup.py [--python python3.11] [--out benchmarks/results/node_setup.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _machine import cpu_seconds  # noqa: E402  (benchmarks/ is sys.path[0])
from _results import write_results  # noqa: E402


def timed(commands: list[list[str]], cwd: Path) -> tuple[float, float]:
    """(wall seconds, the commands' own CPU seconds) of the commands run one after the other;
    the first failure stops the benchmark."""
    start, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for command in commands:
        subprocess.run(command, cwd=cwd, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - start, after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime


def size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default="python3.11", help="the cluster's Python (cluster/python-version)")
    parser.add_argument("--work", default=None, help="an empty or new folder (default: a new temporary one)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "node_setup.json"))
    parser.add_argument("--wheelhouse", default=None, help="a wheelhouse built before: not built again nor timed")
    parser.add_argument("--registry-first", action="store_true", help="the registry's worker before the wheelhouse's")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="node-setup-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        sys.exit(f"node_setup.py: --work {work} is not empty; give an empty or new folder")
    source = work / "rerank-lab"
    wheelhouse = Path(args.wheelhouse).resolve() if args.wheelhouse else work / "wheelhouse"
    source.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    load_before, (busy_before, _) = os.getloadavg(), cpu_seconds()

    def pip(venv: str, *arguments: str) -> list[str]:
        return [str(work / venv / "bin" / "pip"), *arguments]

    subprocess.run([args.python, "-m", "venv", str(work / "builder")], check=True)
    steps = {
        "worker_from_wheelhouse": [
            [args.python, "-m", "venv", str(work / "from-wheelhouse")],
            pip("from-wheelhouse", "install", "-q", "--no-cache-dir", "--no-index", "--find-links", str(wheelhouse),
                "--upgrade", "pip"),
            pip("from-wheelhouse", "install", "-q", "--no-cache-dir", "--no-index", "--find-links", str(wheelhouse), "-e", "."),
        ],
        "worker_from_registry": [
            [args.python, "-m", "venv", str(work / "from-registry")],
            pip("from-registry", "install", "-q", "--no-cache-dir", "--upgrade", "pip"),
            pip("from-registry", "install", "-q", "--no-cache-dir", "-e", "."),
        ],
    }
    if not args.wheelhouse:
        steps = {"build_wheelhouse": [pip("builder", "wheel", "-q", "--no-cache-dir", "--wheel-dir", str(wheelhouse),
                                          ".[aws]", "setuptools>=68", "pip")], **steps}
    order = sorted(steps, key=lambda name: name == ("worker_from_wheelhouse" if args.registry_first else "worker_from_registry"))
    seconds, cpu = {}, {}
    for name in order:
        seconds[name], cpu[name] = timed(steps[name], source)
    busy = cpu_seconds()[0] - busy_before
    torch_wheels = sorted(p.name for p in wheelhouse.glob("torch-*.whl"))
    sizes = {"wheelhouse_bytes": size_bytes(wheelhouse), "wheels": len(list(wheelhouse.glob("*.whl"))),
             "torch_wheel": torch_wheels, "venv_bytes": size_bytes(work / "from-wheelhouse")}
    python = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], check=True,
                            capture_output=True, text=True).stdout.strip()
    pip_config = subprocess.run(pip("builder", "config", "list"), capture_output=True, text=True).stdout.splitlines()
    for name, value in seconds.items():
        print(f"{name:<24} {value:8.1f} s wall {cpu[name]:8.1f} s CPU")
    print(f"wheelhouse: {sizes['wheels']} wheels, {sizes['wheelhouse_bytes'] / 2**20:.0f} MiB; torch: {torch_wheels}")
    print(f"machine: load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {busy:.0f} busy core-s "
          f"over {sum(seconds.values()):.0f} s on {os.cpu_count()} cores")
    write_results(args.out, args, python=python, seconds=seconds, cpu_seconds=cpu, **sizes, pip_config=pip_config, work=str(work),
                  load_average_before=load_before, load_average_after=os.getloadavg(), busy_core_seconds=busy,
                  cores=os.cpu_count())


if __name__ == "__main__":
    main()
