"""Helpers of the end-to-end tests: tiny sweep and trial files, the CLI in a subprocess, MLflow look-ups."""

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml


def free_port() -> int:
    """A loopback port nothing listens on (closed again before it is returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sweep_yaml(path: Path, model_dir: Path, name: str, losses: list[dict], epochs: int = 1,
               interpolation: str = "none", test_collection: str | None = None) -> Path:
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
                 "augmentations": [{"method": "bm25", "k": 2}], "sizes": [16]},
        # exhaustive: these tests count exact runs (pruning has its own tests)
        "search": {"trials_per_cell": 2, "pruner": "none", "learning_rate": {"low": 1e-4, "high": 1e-3, "log": True},
                   "lambda": {"low": 0.1, "high": 0.9}, "tau": {"low": 0.05, "high": 0.5, "log": True},
                   "contrastive_margin": {"low": 0.2, "high": 1.0}, "k": {"choices": [1, 2]}},
        "max_failures": 1,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def orchestrate(work: Path, *args, background=False, fail_cells: tuple[str, ...] = ()):
    cmd = [sys.executable, "-m", "orchestrator.cli", *args]
    env = dict(os.environ)
    if fail_cells:  # the test hook: trials of these cells raise on purpose
        env["ORCHESTRATE_TEST_FAIL_CELLS"] = ",".join(fail_cells)
    if background:
        return subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL,
                                stderr=open(work / "background.err", "w"), start_new_session=True)
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1200)


def mlflow_runs(uri: str, experiment: str):
    from orchestrator.core.tracking import Tracker

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
    import shutil

    import pytest

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
    import signal
    import time
    import urllib.request

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
