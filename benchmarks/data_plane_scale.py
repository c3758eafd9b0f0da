"""What the data plane costs as the corpus grows: `orchestrate prepare` of a doc19-shaped sweep
on synthetic MS MARCO-shaped collections of growing size, cold and warm, and one trial's own
preparation in a fresh process.

    ORCHESTRATE_DATA_DIR=/path/to/data python benchmarks/data_plane_scale.py --sizes 20000 200000 [--workdir DIR]

Per size: a collection from ``synthetic_collection.py`` (the same 6,000 train, 1,000 dev and
200 test queries at every size), a sweep of doc19's shape on it (MiniLM-L6 at 512 tokens;
pointwise + SCL; bm25, glove, linear and attention augmentation with k_a = 3; sizes 100,
1,000 and 10,000 pairs; validation capped at 500 dev queries at depth 100; SciFact as a
zero-shot target), prepared in an empty cache (cold) and again (warm). Measured per command:
wall and CPU seconds, the peak RSS of every process it started (sampled from /proc every
0.2 s: Python and the Lucene JVM apart, anonymous memory apart from mapped files' pages,
which the kernel drops under pressure), and the time of each step its log reports (the corpus store, the
index, retrieval, sentence statistics, training and augmentation sets). Then one cell's
trial preparation, warm, in a fresh process: what a Tune trial pays before training.

The supervised cells (linear, attention) wait for their selectors, which are trained, not
prepared: their selectors' data is prepared, their own augmentation is not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _results import write_results  # noqa: E402  (benchmarks/ is sys.path[0])

# the log lines of the data plane that time a step, and the step each names
STEPS = {
    "corpus store": re.compile(r"stored [\d,]+ documents .* in ([\d.]+)s"),
    "index": re.compile(r"indexed in ([\d.]+)s"),
    "retrieval": re.compile(r"retrieved in ([\d.]+)s"),
    "sentence statistics": re.compile(r"sentence statistics of .* in ([\d.]+)s"),
    "augmentation sets": re.compile(r"k_a=\d+ epoch \d+: \d+ rows in ([\d.]+)s"),
}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _rss(pid: int) -> tuple[str, int, int] | None:
    """(name, anonymous RSS, file-backed RSS) of a process: memory-mapped files the kernel can drop
    (the corpus store, token ids) count apart from memory the process holds."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        return fields["Name"].strip(), int(fields["RssAnon"].split()[0]) * 1024, int(fields["RssFile"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def measure(command: list[str], env: dict, log: Path) -> dict:
    """Run ``command``; its wall and CPU seconds and the peak RSS per process name (sampled)."""
    peaks: dict[str, int] = {}
    with open(log, "w") as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for pid in _descendants(process.pid):
                    found = _rss(pid)
                    if found:
                        name = "java" if "java" in found[0] else "python" if "python" in found[0] else found[0]
                        peaks[name] = max(peaks.get(name, 0), found[1])
                        peaks[f"{name} mapped files"] = max(peaks.get(f"{name} mapped files", 0), found[2])
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        sampler.join()
    text = log.read_text()
    steps = {name: round(sum(float(m) for m in pattern.findall(text)), 1) for name, pattern in STEPS.items()}
    return {"returncode": os.waitstatus_to_exitcode(status), "wall_s": round(time.perf_counter() - started, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_gb": {k: round(v / 2**30, 2) for k, v in sorted(peaks.items())},
            "steps_s": {k: v for k, v in steps.items() if v}, "log": str(log)}


def sweep_file(collection: Path, out: Path) -> Path:
    sweep = {
        "name": f"scale-{collection.name}",
        "base": {
            "data": {"collection": str(collection), "train_split": "train", "validation_split": "dev", "validation_cap": 500,
                     "test_split": "test"},
            "first_stage": {"train_depth": 100, "validation_depth": 100, "test_depth": 100},
            "optimization": {"epochs": 1, "batch_size": 16},
            "resources": {"workers": 1, "cpus_per_worker": 1},
        },
        "grid": {"models": ["minilm-l6"], "max_length": 512,
                 "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
                 "augmentations": [{"method": "bm25", "k": 3},
                                   {"method": "glove", "k": 3, "glove_path": "glove/glove.6B.50d.top100k.txt.gz"},
                                   {"method": "linear", "k": 3, "selector": {"k": 20, "data": "cell"}},
                                   {"method": "attention", "k": 3, "selector": {"k": 20, "data": "cell"}}],
                 "sizes": [100, 1000, 10000], "seeds": [13]},
        "search": {"trials_per_cell": 1, "learning_rate": {"choices": [3.0e-5]}, "lambda": {"low": 0.1, "high": 0.9},
                   "tau": {"low": 0.05, "high": 1.0, "log": True}},
        "zero_shot": [{"collection": "beir/scifact", "split": "test"}],
    }
    out.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return out


TRIAL_PREPARATION = """
import resource, sys, time
started = time.perf_counter()
from orchestrator.sweep.grid import expand_grid, load_sweep
from workloads.kinds import kind_of
from workloads.data.docstore import DocStore
sweep = load_sweep(sys.argv[1])
cells = [c for c in expand_grid(sweep) if c.spec.augmentation.method == "bm25" and c.spec.training_data.size == 10000]
imported = time.perf_counter()
kind_of(cells[0].spec).prepare(cells[0].spec)
print({"seconds": round(time.perf_counter() - imported, 2), "with_imports_s": round(time.perf_counter() - started, 2),
       "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2), "documents_read": DocStore.reads,
       "rss_anon_gb": round(int(open("/proc/self/status").read().split("RssAnon:")[1].split()[0]) / 2**20, 2)})
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/data-plane-scale"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "data_plane_scale.json"))
    args = parser.parse_args()
    python = sys.executable
    results = []
    for size in args.sizes:
        collection = args.workdir / "collections" / f"synthetic-{size}"
        if not (collection / "qrels" / "test.tsv").exists():
            subprocess.run([python, str(REPO / "benchmarks" / "synthetic_collection.py"), str(size), str(collection)], check=True)
        synthetic = json.loads((collection / ".synthetic.json").read_text())
        cache = args.workdir / f"cache-{size}"
        subprocess.run(["rm", "-rf", str(cache)], check=True)
        env = dict(os.environ, ORCHESTRATE_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        sweep = sweep_file(collection, args.workdir / f"scale-{size}.yaml")
        row = {"documents": size, "corpus_gb": round(synthetic["corpus_bytes"] / 2**30, 2), "mean_words": synthetic["mean_words"]}
        for phase in ("cold", "warm"):
            row[phase] = measure([python, "-m", "orchestrator.cli", "-v", "prepare", str(sweep), "--json"], env,
                                 args.workdir / f"prepare-{size}-{phase}.log")
            print(f"{size:>9,} {phase}: {row[phase]}", flush=True)
        trial = subprocess.run([python, "-c", TRIAL_PREPARATION, str(sweep)], env=env, cwd=REPO, capture_output=True, text=True)
        row["trial_preparation"] = eval(trial.stdout.strip().splitlines()[-1]) if trial.returncode == 0 else trial.stderr[-500:]
        print(f"{size:>9,} trial: {row['trial_preparation']}", flush=True)
        results.append(row)
    print("\n| documents | corpus GB | cold prepare s (CPU s) | peak RSS python / java GB | warm prepare s "
          "| peak RSS warm GB | trial prep s | trial RSS GB | cold steps s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in results:
        cold, warm, trial = row["cold"], row["warm"], row["trial_preparation"]
        trial = trial if isinstance(trial, dict) else {"seconds": "failed", "peak_rss_gb": "-"}
        print(f"| {row['documents']:,} | {row['corpus_gb']} | {cold['wall_s']} ({cold['cpu_s']}) | "
              f"{cold['peak_rss_gb'].get('python', '-')} / {cold['peak_rss_gb'].get('java', '-')} | {warm['wall_s']} | "
              f"{warm['peak_rss_gb'].get('python', '-')} | {trial['seconds']} | {trial['peak_rss_gb']} | "
              f"{', '.join(f'{k} {v}' for k, v in cold['steps_s'].items())} |")
    args.workdir = str(args.workdir)
    write_results(args.out, args, results=results)


if __name__ == "__main__":
    main()
