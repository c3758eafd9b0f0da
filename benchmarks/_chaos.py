"""Faults thrown at one small sweep from a seeded schedule, each followed by the documented
recovery (rerun the same ``orchestrate sweep``), and the outcome compared with the same grid run
without faults. Shared by tests/sweep/test_chaos.py (one seed) and benchmarks/chaos.py (many).

A fault is a kind and a moment. Kinds: ``driver`` (SIGKILL of the sweep's process group: the
driver and the local Ray it started), ``trial`` (SIGKILL of a Tune trial process),
``train_worker`` (SIGKILL of a Ray Train worker) and ``enospc`` (the N-th of the project's
atomic writes, any process, fails with ENOSPC: workloads.core.paths.FULL_DISK_ENV). A moment
is a condition on the store: ``finished`` k trial runs FINISHED in MLflow, ``in_epoch`` the
first in-epoch checkpoint written, or ``delay`` seconds after a driver started.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

# isort: off
import ray._common.utils  # noqa: F401  (first: it puts Ray's vendored psutil on the path)
import psutil
# isort: on

from workloads.core.paths import FULL_DISK_ENV

PROCESS_KINDS = ("driver", "trial", "train_worker")
FAULT_KINDS = (*PROCESS_KINDS, "enospc")
# Ray's process titles (`ps` during a sweep): Tune's trial actor runs the trial function, which
# runs a Ray Train fit whose workers are RayTrainWorker actors.
TITLES = {"trial": ("ray::ImplicitFunc", "ray::_Inner"), "train_worker": ("ray::RayTrainWorker",)}
CHECKS = ("recovered", "runs_by_count_and_key", "no_duplicates", "none_running", "same_winners",
          "test_values_fp32", "validation_values_fp32", "epochs_logged_once", "trials_per_cell",
          "same_parameters_same_values", "no_epoch_twice", "nothing_half_written", "nothing_outside_touched")
# Every check above is the bar, asserted by the fast variant. Some once failed after a
# driver's SIGKILL with a cell's first trial in flight (docs/performance.md#faults-and-recovery):
# the rerun re-asked the trial as a new Optuna trial, which moved the cell's later trials to other
# names and draws (a trial's identity is now its slot: orchestrator.sweep.search.next_slot), and a
# trial whose last epochs the killed driver had received but not logged reported them nowhere
# (its final result now carries its epochs: orchestrator.sweep.tune.EPOCH_HISTORY).


@dataclass
class Fault:
    kind: str
    moment: tuple  # ("finished", k) | ("in_epoch",) | ("delay", seconds) | ("write", n) for enospc
    injected: bool = False
    detail: str = ""


def schedule(seed: int) -> list[Fault]:
    """Every process kind once, in a seeded order at seeded moments, and a full disk at a seeded write."""
    rng = random.Random(seed)
    faults = []
    for kind in rng.sample(PROCESS_KINDS, len(PROCESS_KINDS)):
        moment = rng.choice([("finished", rng.randint(0, 2)), ("in_epoch",), ("delay", rng.randint(5, 40))])
        faults.append(Fault(kind, moment))
    faults.append(Fault("enospc", ("write", rng.randint(1, 12))))
    return faults


def chaos_grid(path: Path, model_dir: Path, name: str = "chaos") -> Path:
    """Two cells (a baseline and pointwise+scl with BM25 augmentation), two trials each, two
    epochs of 4 steps with an in-epoch checkpoint after every step; Tune retries a trial 3 times, so that
    one seed's trial faults never exhaust its retries (a trial that did would differ from the
    reference by design: its slot is used up)."""
    config = {
        "name": name,
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 # fp32: the values are compared bit for bit (auto picks bf16 on a CPU where it is faster)
                 "optimization": {"epochs": 2, "batch_size": 4, "checkpoint_every": {"steps": 1}, "precision": "fp32"},
                 "resources": {"workers": 1, "cpus_per_worker": 1}},
        "grid": {"models": [str(model_dir)], "max_length": 64, "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
                 "augmentations": [{"method": "bm25", "k": 2}], "sizes": [16]},
        "search": {"trials_per_cell": 2, "pruner": "none", "learning_rate": {"low": 1e-4, "high": 1e-3, "log": True},
                   "lambda": {"low": 0.1, "high": 0.9}, "tau": {"low": 0.05, "high": 0.5, "log": True}},
        "max_failures": 3,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Sweep:
    """One sweep file run in ``work``: its store and MLflow database under ``work``, its cache
    there too unless ``shared_cache`` (a test session's, built once for every test) names one."""
    spec: Path
    work: Path
    name: str = "chaos"
    shared_cache: Path | None = None
    log: list = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.work / 'mlflow.db'}"

    @property
    def store(self) -> Path:
        return self.work / "store"

    @property
    def cache(self) -> Path:
        return self.shared_cache or self.work / "cache"

    def env(self, full_disk_at: int | None = None) -> dict:
        env = {**os.environ, "ORCHESTRATE_CACHE_DIR": str(self.cache)}
        env.pop(FULL_DISK_ENV, None)
        if full_disk_at is not None:
            env[FULL_DISK_ENV] = f"{self.work / 'writes.count'}:{full_disk_at}"
        return env

    def start(self, full_disk_at: int | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "orchestrator.cli", "sweep", str(self.spec), "--json",
               "--storage", str(self.store), "--tracking-uri", self.uri]
        index = len(self.log)
        self.log.append({"run": index})
        return subprocess.Popen(cmd, cwd=self.work, env=self.env(full_disk_at), stdout=open(self.work / f"run{index}.out", "w"),
                                stderr=open(self.work / f"run{index}.err", "w"), start_new_session=True)

    def client(self):
        from orchestrator.core.tracking import Tracker  # noqa: PLC0415  (MLflow: imported when used)

        return Tracker(self.uri).client

    def runs(self):
        client = self.client()
        found = client.get_experiment_by_name(self.name)
        return client.search_runs([found.experiment_id], max_results=1000) if found else []

    def finished_trials(self) -> int:
        try:
            return sum(r.data.tags.get("rerank_lab.kind") == "trial" and r.info.status == "FINISHED" for r in self.runs())
        except Exception:  # the driver is creating or migrating the store: not yet
            return 0


def clean_run(sweep: Sweep, timeout: float = 1200) -> int:
    sweep.runs()  # create the store first: two processes migrating a new SQLite DB collide
    driver = sweep.start()
    return driver.wait(timeout)


def _reached(fault: Fault, sweep: Sweep, started: float) -> bool:
    what = fault.moment[0]
    if what == "delay":
        return time.time() - started >= fault.moment[1]
    if what == "in_epoch":
        return any(sweep.store.glob("**/in-epoch-checkpoint"))
    return sweep.finished_trials() >= fault.moment[1]


def ray_processes(session: int, titles: tuple[str, ...]) -> list[psutil.Process]:
    """The processes of the sweep's session (its local Ray) whose title starts with one of ``titles``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if os.getsid(process.pid) == session and " ".join(process.info["cmdline"] or []).startswith(titles):
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _inject(fault: Fault, driver: subprocess.Popen) -> bool:
    if fault.kind == "driver":
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray it started: a crash, not a shutdown
        driver.wait()
        fault.detail = "driver process group killed"
        return True
    targets = ray_processes(driver.pid, TITLES[fault.kind])
    if not targets:
        fault.detail = "seen: " + ", ".join(sorted({" ".join(p.cmdline())[:40] for p in ray_processes(driver.pid, ("ray::",))}))
        return False
    target = targets[0]
    fault.detail = f"killed {' '.join(target.cmdline())[:60]} (pid {target.pid})"
    target.kill()
    return True


def faulted_run(sweep: Sweep, faults: list[Fault], timeout: float = 1800, max_starts: int = 8) -> dict:
    """Run the sweep, inject ``faults`` in order at their moments, rerun after every driver
    exit until a run ends cleanly with no fault left to inject; what happened, per run."""
    sweep.runs()
    full_disk = next((f for f in faults if f.kind == "enospc"), None)
    pending = [f for f in faults if f.kind != "enospc"]
    deadline = time.time() + timeout
    driver, started = sweep.start(full_disk and full_disk.moment[1]), time.time()
    while time.time() < deadline:
        if pending and _reached(pending[0], sweep, started):
            if _inject(pending[0], driver):
                pending[0].injected = True
                sweep.log[-1].setdefault("faults", []).append(pending[0].kind)
                pending.pop(0)
        if driver.poll() is not None:
            sweep.log[-1]["rc"] = driver.returncode
            sweep.log[-1]["stderr_tail"] = (sweep.work / f"run{len(sweep.log) - 1}.err").read_text()[-600:]
            if driver.returncode == 0 and not pending:
                break
            if driver.returncode == 0 and pending:  # the grid ended before the moment: nothing left to hit
                for fault in pending:
                    fault.detail = "the grid ended before its moment"
                break
            if len(sweep.log) >= max_starts:
                break
            driver, started = sweep.start(full_disk and full_disk.moment[1]), time.time()  # the recovery: rerun
        time.sleep(0.5)
    else:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        sweep.log[-1]["rc"] = "timed out"
    if full_disk is not None:
        count_file = sweep.work / "writes.count"
        full_disk.injected = count_file.exists() and int(count_file.read_text() or 0) >= full_disk.moment[1]
        in_driver = [run["stderr_tail"].strip().splitlines()[-1] for run in sweep.log
                     if "no space left" in run.get("stderr_tail", "").lower()]
        log = sweep.store / sweep.name / "sweep.log"  # a Ray worker's error lands in the sweep's log
        in_workers = re.findall(r"No space left on device: '([^']+)'", log.read_text()) if log.exists() else []
        full_disk.detail = (in_driver and f"driver: {in_driver[0]}") or (in_workers and f"worker: {in_workers[0]}") or ""
    return {"runs": sweep.log, "final_rc": sweep.log[-1].get("rc"), "unexpected_exits": unexpected_exits(sweep.log)}


def unexpected_exits(log: list[dict]) -> list[int]:
    """The runs that ended by themselves other than with success: every rerun is the documented
    recovery and must finish, except one that a full disk ended with its one-line error (exit 2)."""
    return [run["run"] for run in log if "driver" not in run.get("faults", []) and run.get("rc") != 0
            and not (run.get("rc") == 2 and "no space left on device" in run.get("stderr_tail", ""))]


def outcome(sweep: Sweep) -> dict:
    """What the two runs of a grid are compared on: runs by kind and key, statuses, winners, values."""
    runs, client = sweep.runs(), sweep.client()
    key_of = {r.info.run_id: r.data.tags.get("rerank_lab.trial_key") for r in runs}
    cells = [r for r in runs if r.data.tags.get("rerank_lab.kind") == "cell"]
    trials = [r for r in runs if r.data.tags.get("rerank_lab.kind") == "trial"]
    return {
        "keys": sorted((r.data.tags.get("rerank_lab.kind"), r.data.tags.get("rerank_lab.trial_key")) for r in runs),
        "statuses": sorted(r.info.status for r in runs),
        "winners": {r.data.tags["rerank_lab.cell"]: key_of.get(r.data.tags.get("rerank_lab.winner")) for r in cells},
        # fp32: what the values are computed in; compared as bits
        "test": {r.data.tags["rerank_lab.cell"]: {k: _bits(v) for k, v in sorted(r.data.metrics.items()) if k.startswith("test_")}
                 for r in cells},
        "validation": {r.data.tags["rerank_lab.trial_key"]: _bits(r.data.metrics.get("best_val_ndcg_at_10")) for r in trials},
        # a trial by what it tried, whatever its number: the validation value of each parameter set
        "by_parameters": {_tried(r): _bits(r.data.metrics.get("best_val_ndcg_at_10")) for r in trials},
        # each epoch logged once: a resumed trial neither retrains nor re-logs what it had reported
        "epochs": {r.data.tags["rerank_lab.trial_key"]:
                   sorted(m.step for m in client.get_metric_history(r.info.run_id, "epoch_train_seconds")) for r in trials},
    }


def _tried(run) -> str:
    searched = {k: v for k, v in sorted(run.data.params.items()) if k.startswith("searched.")}
    return f"{run.data.tags['rerank_lab.cell']} {json.dumps(searched)}"


def _bits(value) -> str | None:
    return None if value is None else np.float32(value).tobytes().hex()


HALF_WRITTEN = (".writing", ".previous", ".tmp", ".partial")


def half_written(*roots: Path) -> list[str]:
    """Paths a write left behind unfinished: in-epoch checkpoints' ``.writing``/``.previous``,
    temporary files, and atomic writes' hidden temporary folders (``.NAME.xxxx/out*``,
    workloads.core.paths.atomic_path), which a kill during the write leaves."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            atomic_temp = path.name.startswith("out") and path.parent.name.startswith(".") and path.parent != root
            if path.name.endswith(HALF_WRITTEN) or atomic_temp:
                found.append(str(path.relative_to(root)))
    return found


# what a sweep run in a work folder writes there: its store, MLflow database and artifacts, its
# cache (ORCHESTRATE_CACHE_DIR), the full-disk write counter and each run's output
WRITTEN_IN_WORK = ("store", "mlflow.db", "mlartifacts", "cache", "writes.count")


def outside_snapshot(work: Path, repo: Path | None, data: Path) -> tuple:
    """What a sweep must not touch, taken before and after: the repository's git status (not
    where the repository is being edited meanwhile: ``repo`` None), every file of the data
    folder (size, mtime) and the names in the work folder."""
    status = repo and subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    files = {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in data.rglob("*") if p.is_file()}
    return status, files, {p.name for p in work.iterdir()}


def untouched(before: tuple, after: tuple) -> bool:
    new = after[2] - before[2]
    return after[:2] == before[:2] and all(n in WRITTEN_IN_WORK or re.fullmatch(r"run\d+\.(out|err)", n) for n in new)


def compare(reference: dict, faulted: dict, sweep: Sweep, runs: dict, outside_untouched: bool,
            half_written_before: list[str] = ()) -> dict:
    """Each check of the issue: True when it held (a shared cache's leftovers from before,
    ``half_written_before``, are not this sweep's)."""
    keys = faulted["keys"]
    return {
        "recovered": runs["final_rc"] == 0 and not runs["unexpected_exits"],
        "runs_by_count_and_key": Counter(map(tuple, reference["keys"])) == Counter(map(tuple, keys)),
        "no_duplicates": len(keys) == len(set(map(tuple, keys))),
        "none_running": "RUNNING" not in faulted["statuses"] and faulted["statuses"] == reference["statuses"],
        "same_winners": faulted["winners"] == reference["winners"],
        "test_values_fp32": faulted["test"] == reference["test"] and bool(reference["test"]),
        "validation_values_fp32": faulted["validation"] == reference["validation"],
        "epochs_logged_once": faulted["epochs"] == reference["epochs"],
        "trials_per_cell": _per_cell(faulted["validation"]) == _per_cell(reference["validation"]),
        "same_parameters_same_values": all(faulted["by_parameters"][p] == v for p, v in reference["by_parameters"].items()
                                           if p in faulted["by_parameters"]),
        "no_epoch_twice": all(len(set(steps)) == len(steps) for steps in faulted["epochs"].values()),
        "nothing_half_written": not set(half_written(sweep.store, sweep.cache)) - set(half_written_before),
        "nothing_outside_touched": outside_untouched,
    }


def _per_cell(trial_keys) -> Counter:
    return Counter(key.split("/")[0] for key in trial_keys)


def differences(reference: dict, faulted: dict) -> dict:
    """What differed, for a failure message."""
    return {k: {"reference": reference[k], "faulted": faulted[k]} for k in reference if reference[k] != faulted[k]}


def report(faults: list[Fault], checks: dict, runs: dict) -> str:
    return json.dumps({"faults": [asdict(f) for f in faults], "checks": checks, "runs": runs}, indent=1, default=str)
