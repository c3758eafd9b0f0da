"""Helpers of the end-to-end tests: tiny sweep and trial files, the CLI in a subprocess, MLflow look-ups."""

import contextlib
import io
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from orchestrator import cli
from orchestrator.cli import output
from orchestrator.core.tracking import Tracker
from workloads.evaluation import SELECTION_PER_QUERY


def assert_validates_query_by_query(metrics: dict, queries: int) -> None:
    """An epoch's report holds each validation query's nDCG@10 (what a sweep's Wilcoxon pruner
    compares trials on): one value per query, whose mean is the epoch's validation value."""
    values = metrics[SELECTION_PER_QUERY]
    assert len(values) == queries and all(0.0 <= v <= 1.0 for v in values), values
    assert sum(values) / len(values) == pytest.approx(metrics["val_ndcg_at_10"], abs=1e-12)


def free_port() -> int:
    """A loopback port nothing listens on (closed again before it is returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_cluster(port: int) -> None:
    """Kill only this cluster's processes (`ray stop` would stop every Ray on the machine)."""
    # isort: off
    from ray._common.utils import get_ray_address_file  # noqa: PLC0415  (first: psutil is Ray's vendored copy)
    import psutil  # noqa: PLC0415
    # isort: on

    # Its GCS port, however the address is spelled (127.0.0.1:PORT, <node ip>:PORT,
    # --gcs_server_port=PORT): the monitor and log monitors name it by the node's IP, and
    # survived as orphans when only 127.0.0.1 was matched.
    names_port = re.compile(rf"[:=]{port}(?!\d)")
    mine = [process for process in psutil.process_iter(["cmdline"])
            if names_port.search(" ".join(process.info["cmdline"] or []))]
    for process in list(mine):  # and their agents (named ray::DashboardAgent, ...: no port)
        try:
            mine += process.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for process in mine:
        try:
            process.kill()
        except psutil.NoSuchProcess:  # exited with its raylet
            pass
    psutil.wait_procs(mine, timeout=30)
    # `ray start` wrote this cluster's address for later drivers; `ray stop` would remove it.
    # Left behind, it pointed every later Ray's State API at a dead cluster.
    address_file = Path(get_ray_address_file(None))
    if address_file.exists() and address_file.read_text().strip().endswith(f":{port}"):
        address_file.unlink(missing_ok=True)


def sweep_yaml(path: Path, model_dir: Path, name: str, losses: list[dict], epochs: int = 1,
               interpolation: str = "none", test_collection: str | None = None, trials_per_cell: int = 2,
               augmentations: tuple[dict, ...] = ({"method": "bm25", "k": 2},)) -> Path:
    """A tiny sweep on SciFact. Its cells: a baseline (pointwise, no augmentation) and one per
    loss x augmentation; ``losses=[{"ranking": "pointwise"}], augmentations=({"method": "none"},)``
    is the baseline cell alone."""
    config = {
        "name": name,
        "base": {
            "data": {"collection": "beir/scifact", "validation_queries": 5,
                     **({"test_collection": test_collection} if test_collection else {})},
            "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
            "reranking": {"interpolation": interpolation},
            "optimization": {"epochs": epochs, "batch_size": 8},
            "resources": {"workers": 1, "cpus_per_worker": 1},
        },
        "grid": {"models": [str(model_dir)], "max_length": 64, "losses": losses,
                 "augmentations": list(augmentations), "sizes": [16]},
        # exhaustive: these tests count exact runs (pruning has its own tests)
        "search": {"trials_per_cell": trials_per_cell, "pruner": "none", "learning_rate": {"low": 1e-4, "high": 1e-3, "log": True},
                   "lambda": {"low": 0.1, "high": 0.9}, "tau": {"low": 0.05, "high": 0.5, "log": True},
                   "contrastive_margin": {"low": 0.2, "high": 1.0}, "k": {"choices": [1, 2]}},
        "max_failures": 1,
    }
    path.write_text(yaml.safe_dump(config))
    return path


FAIL_CELLS_ENV = "ORCHESTRATE_TEST_FAIL_CELLS"  # the test hook: trials of these cells raise on purpose


def orchestrate(work: Path, *args, background=False, fail_cells: tuple[str, ...] = ()):
    """``orchestrate ARGS`` in a fresh interpreter (``background``: started, not waited for)."""
    cmd = [sys.executable, "-m", "orchestrator.cli", *args]
    env = dict(os.environ)
    if fail_cells:
        env[FAIL_CELLS_ENV] = ",".join(fail_cells)
    if background:
        return subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                stderr=open(work / "background.err", "w"), start_new_session=True)
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1200)


class _CommandTimedOut(BaseException):
    """Raised by SIGALRM inside an in-process command; a BaseException, so no ``except Exception`` hides it."""


def run_cli(cwd: Path | None, *args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``orchestrate ARGS`` in this process, as a subprocess would see it: results (stdout) and
    the rest (stderr) captured apart, the exit code returned (SystemExit and tracebacks included),
    run in ``cwd`` with ``env`` added to the environment. Imports and Ray's first start are paid
    once per test session instead of once per call (a fresh interpreter costs seconds on 2 cores).
    The working directory, environment and the project's logging are restored afterwards, and a
    Ray the command started is shut down.
    For what a subprocess alone shows (signals, exit of the interpreter, descriptor-level output,
    a fresh interpreter's imports) use :func:`orchestrate`."""
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_stream = dict(os.environ), os.getcwd(), getattr(output, "_result_stream", None)
    project = logging.getLogger("rerank_lab")
    saved_logging = (list(project.handlers), project.level, project.propagate)

    def route_results():  # the real one re-points descriptor 1 for the rest of the process
        output._result_stream = out
        sys.stdout = sys.stderr

    def timed_out(signum, frame):
        raise _CommandTimedOut(f"orchestrate {' '.join(args)} ran past {timeout} s")

    ray_before = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    previous_alarm = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(timeout)
    original_route = output.route_results
    output.route_results = route_results
    cli_route = vars(cli).get("route_results")  # the name main() calls, when the package imports it
    if cli_route is not None:
        cli.route_results = route_results
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    print(exc.code, file=sys.stderr)
            except Exception:  # the interpreter would print the traceback and exit 1
                traceback.print_exc()
                code = 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_alarm)
        if not ray_before and "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()  # a Ray the command started ends with it, as with its process
        output.route_results = original_route
        if cli_route is not None:
            cli.route_results = cli_route
        output._result_stream = saved_stream
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for handler in list(project.handlers):
            project.removeHandler(handler)
        for handler in saved_logging[0]:
            project.addHandler(handler)
        project.setLevel(saved_logging[1])
        project.propagate = saved_logging[2]
    return subprocess.CompletedProcess(["orchestrate", *map(str, args)], code or 0, out.getvalue(), err.getvalue())


def mlflow_runs(uri: str, experiment: str):
    client = Tracker(uri).client  # metrics under the code's names, whichever way the store names them
    found = client.get_experiment_by_name(experiment)
    return client, (client.search_runs([found.experiment_id], max_results=1000) if found else [])


def by_kind(runs, kind):
    return [r for r in runs if r.data.tags.get("rerank_lab.kind") == kind]


HELD_OUT_QUERIES = 30


def held_out_scifact(root: Path, scifact_dir: Path) -> Path:
    """A held-out copy of SciFact: the same corpus (linked, not copied), only the first 30 test queries."""
    path = root / "scifact-heldout"
    (path / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl.gz", "queries.jsonl"):
        (path / name).symlink_to(scifact_dir / name)
    lines = (scifact_dir / "qrels" / "test.tsv").read_text().splitlines()
    kept = sorted({line.split()[0] for line in lines[1:]})[:HELD_OUT_QUERIES]
    (path / "qrels" / "test.tsv").write_text("\n".join([lines[0]] + [line for line in lines[1:] if line.split()[0] in kept]) + "\n")
    return path


# The browser tests drive the system's Chromium (Debian: apt-get install chromium chromium-driver,
# which .ci/run does). Where none can be installed they skip, except where this is set (CI):
# there a missing browser fails.
REQUIRE_BROWSER_ENV = "ORCHESTRATE_REQUIRE_BROWSER"


def chromium_driver():
    """A headless Chromium driven by Selenium, or the test skips (fails under REQUIRE_BROWSER_ENV)."""
    binary = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    chromedriver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    missing = [what for what, found in (("selenium", webdriver), ("chromium", binary), ("chromedriver", chromedriver))
               if found is None]
    if missing:
        reason = f"no {', '.join(missing)}: apt-get install chromium chromium-driver; pip install selenium"
        if os.environ.get(REQUIRE_BROWSER_ENV):
            pytest.fail(f"{REQUIRE_BROWSER_ENV} is set and {reason}")
        pytest.skip(reason)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager never downloads a driver: the system's is given
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1400"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(chromedriver), options=options)


@contextlib.contextmanager
def serve_ui(work: Path, config: Path, uri: str, port: int, timeout: float = 120):
    """`orchestrate ui CONFIG` in the background until the server answers; yields the links it
    printed ({label: url}); stopped on exit."""
    log_path = work / f"ui-{port}.err"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", str(config), "--tracking-uri", uri,
                             "--port", str(port)], cwd=work, env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"orchestrate ui never answered on port {port}: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        links = {}
        for line in log_path.read_text().splitlines():
            text = line.removeprefix("[orchestrate]").strip()
            if text.startswith("MLflow UI for ") and " on http" in text:  # the experiment's own page
                links["experiment"] = "http" + text.rsplit(" on http", 1)[1]
                continue
            label, sep, url = text.partition(": http")
            if sep and " " not in url:
                links[label] = "http" + url
        yield links
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
