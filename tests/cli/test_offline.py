"""Offline, a dataset or model that would need a download fails at once: one line naming the
reference and what to do, exit 2, no traceback, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.core import execution
from workloads.core.errors import InputError
from workloads.models.cross_encoder import require_model_available

REPO = Path(__file__).resolve().parents[2]


def offline_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ORCHESTRATE_DATA_DIR": str(tmp_path / "no-data"),  # nothing local
        "IR_DATASETS_HOME": str(tmp_path / "ir_datasets"),  # nothing downloaded before
        "HF_HOME": str(tmp_path / "hf"),                    # an empty Hugging Face cache
        "HF_HUB_OFFLINE": "1",
        # a closed local port as the proxy: any download attempt is refused at once, connected or not
        "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
    })
    (tmp_path / "no-data").mkdir(exist_ok=True)
    return env


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=tmp_path, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=300)


def assert_one_clear_line(proc: subprocess.CompletedProcess, *expected: str) -> None:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert all(text in errors[0] for text in expected), errors[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_beir_id_not_under_the_data_dir(tmp_path):
    proc = cli(tmp_path, "bm25", "--dataset", "beir/scifact", "--split", "test")
    assert_one_clear_line(proc, "beir/scifact: not found locally", "ORCHESTRATE_DATA_DIR", "'scifact/'")
    assert "[INFO]" not in proc.stderr  # ir_datasets' own retry log is held back
    assert not (tmp_path / ".orchestrate").exists() or not any((tmp_path / ".orchestrate").rglob("*.parquet"))


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_hugging_face_id_not_in_the_cache(tmp_path, command):
    base = {"data": {"collection": "beir/scifact"}, "optimization": {"epochs": 1}}
    if command == "run":
        config = {"name": "offline", **base, "model": {"name": "bert-base-uncased"}}
    else:
        config = {"name": "offline", "base": base, "grid": {"models": ["bert-base-uncased"], "losses": [{"ranking": "pointwise"}],
                                                          "augmentations": [{"method": "none"}], "sizes": [100]},
                  "search": {"trials_per_cell": 1}}
    path = tmp_path / "offline.yaml"
    path.write_text(yaml.safe_dump(config))
    env_data = offline_env(tmp_path)["ORCHESTRATE_DATA_DIR"]
    os.symlink(REPO.parent / "shared" / "data" / "scifact", Path(env_data) / "scifact")  # the data is local, the model is not
    proc = cli(tmp_path, command, str(path), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
               "--storage", str(tmp_path / "store"))
    assert_one_clear_line(proc, "model.name bert-base-uncased: not in the local Hugging Face cache", "HF_HUB_OFFLINE")
    if (tmp_path / "mlflow.db").exists():  # nothing tracked for a trial that could not start
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
        assert [e.name for e in client.search_experiments()] == ["Default"]
        assert not client.search_runs(["0"])


def test_downloads_on_without_a_network_is_one_line_too(tmp_path):
    """Downloads are on by default (a cluster node fetches its model); where the Hub cannot be
    reached, a model missing from the cache is one line at once, not an error in every worker."""
    config = {"name": "online", "data": {"collection": "beir/scifact"}, "model": {"name": "bert-base-uncased"}}
    path = tmp_path / "online.yaml"
    path.write_text(yaml.safe_dump(config))
    env = offline_env(tmp_path)
    del env["HF_HUB_OFFLINE"]
    env.pop("TRANSFORMERS_OFFLINE", None)
    os.symlink(REPO.parent / "shared" / "data" / "scifact", Path(env["ORCHESTRATE_DATA_DIR"]) / "scifact")
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", str(path), "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}", "--storage", str(tmp_path / "store")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert_one_clear_line(proc, "model.name bert-base-uncased: not in the local Hugging Face cache and the Hub cannot "
                                "be reached", "HF_HUB_OFFLINE=1")


def test_the_command_line_leaves_downloads_on_and_passes_offline_mode_to_workers(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    execution.set_environment_defaults()
    assert "HF_HUB_OFFLINE" not in os.environ  # on by default: Hugging Face's own behaviour
    assert "HF_HUB_OFFLINE" not in execution.worker_env()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/mnt/shared/cache/huggingface")
    monkeypatch.setenv("IR_DATASETS_HOME", "/mnt/shared/cache/ir_datasets")
    passed = execution.worker_env()  # what init_ray gives every worker: the driver's choices, on every node
    assert passed["HF_HUB_OFFLINE"] == "1" and passed["HF_HOME"] == "/mnt/shared/cache/huggingface"
    assert passed["IR_DATASETS_HOME"] == "/mnt/shared/cache/ir_datasets"
    # where a cluster's State API is served, when the user names it (Train's placement-group cleaner asks it)
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://10.0.0.1:8265")
    assert execution.worker_env()["RAY_API_SERVER_ADDRESS"] == "http://10.0.0.1:8265"


def test_a_model_cached_without_its_weights_is_not_available_offline(tmp_path, monkeypatch):
    """A cache that holds a model's config and tokenizer but not its weights (a download cut
    short, or a repository whose weights were not fetched) fails at once, with one line."""
    import huggingface_hub.constants


    snapshot = tmp_path / "hub" / "models--someone--half-cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--someone--half-cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--half-cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match="not in the local Hugging Face cache"):
        require_model_available("someone/half-cached")
    (snapshot / "pytorch_model.bin").write_bytes(b"weights")
    require_model_available("someone/half-cached")  # config and weights: available
