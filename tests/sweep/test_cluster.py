"""cluster.yaml is a valid Ray cluster config (Ray's own schema), and a sweep runs on a real
two-node Ray cluster started on this machine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.helpers import free_port, mlflow_runs, stop_cluster, sweep_yaml

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

REPO = Path(__file__).resolve().parents[2]


def test_cluster_yaml_validates_against_rays_schema():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    # Ray fills the provider defaults, then checks the schema (as `ray up` does)
    validate_config(prepare_config(config))
    gpu = config["available_node_types"]["gpu_worker"]
    assert gpu["min_workers"] == 0 and gpu["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert gpu["resources"] == {"CPU": 4, "GPU": 1}  # what trial_capacity and check_resources read: 8 doc19 trials at once
    # every node set up by cluster/node-setup.sh (tests/cluster/ test the services, the bootstrap and the guard)
    assert any("cluster/node-setup.sh head" in c for c in config["head_setup_commands"])
    assert any("cluster/node-setup.sh worker" in c for c in config["worker_setup_commands"])
    assert any("service.sh start mlflow" in c for c in config["head_start_ray_commands"])
    setup = (REPO / "cluster" / "node-setup.sh").read_text()
    assert '"python$python_version" -m venv .venv' in setup and '"${pip_install[@]}" -e' in setup  # cluster/python-version's
    shared = "\n".join(line for line in setup.splitlines() if line.startswith("export "))  # downloads and the cache on the shared volume
    for variable in ("HF_HOME", "IR_DATASETS_HOME", "ORCHESTRATE_CACHE_DIR", "ANSERINI_INDEX_CACHE"):
        assert f"{variable}=$shared/" in shared
    assert 'gpu-check.sh" torch' in setup and "torch.cuda.is_available()" in (REPO / "cluster" / "gpu-check.sh").read_text()


def test_the_local_autoscaling_cluster_file_validates_too():
    from ray.autoscaler._private.util import validate_config

    # prepare_config would merge the fake provider's defaults from an example file pip's wheel lacks
    config = yaml.safe_load((REPO / "cluster-local.yaml").read_text())
    validate_config(config)
    assert config["provider"]["type"] == "fake_multinode" and config["available_node_types"]["ray.head.default"]["resources"] == {"CPU": 0}


def test_cluster_yaml_with_a_typo_is_rejected():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    config["available_node_types"]["gpu_worker"]["min_worker"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(config))


@pytest.fixture()
def two_node_cluster(tmp_path, monkeypatch):
    ray = [sys.executable, "-m", "ray.scripts.scripts"]
    port = free_port()
    # Ray 2.59+ enables token authentication for clusters started by `ray start`; this one
    # listens on loopback only, so the head, the worker and the drivers run without it.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # tests/conftest.py's "local": not for the cluster's processes
    head = subprocess.run(ray + ["start", "--head", f"--port={port}", "--num-cpus=1", "--dashboard-host=127.0.0.1",
                                 "--dashboard-port", str(free_port()), "--disable-usage-stats"], capture_output=True, text=True, env=env)
    assert head.returncode == 0, head.stderr[-2000:]
    address = f"127.0.0.1:{port}"
    try:
        worker = subprocess.run(ray + ["start", f"--address={address}", "--num-cpus=1"], capture_output=True, text=True, env=env)
        assert worker.returncode == 0, worker.stderr[-2000:]
        yield address
    finally:
        stop_cluster(port)


@pytest.mark.own_ray  # a cluster of its own (tests/conftest.py)
def test_tiny_sweep_on_a_two_node_cluster(two_node_cluster, tmp_path, tiny_model_dir, scifact_dir):
    import ray

    ray.init(address=two_node_cluster)
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    finally:
        ray.shutdown()

    spec = sweep_yaml(tmp_path / "cluster.yaml", tiny_model_dir, "tiny-cluster", [{"ranking": "pointwise", "contrastive": "scl"}],
                      trials_per_cell=1)  # a trial per node at once
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--json", "--address", two_node_cluster,
                           "--storage", str(tmp_path / "store"), "--tracking-uri", uri],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["trials_to_run"] == 0
    _, runs = mlflow_runs(uri, "tiny-cluster")
    assert len(runs) == 5 and all(r.info.status == "FINISHED" for r in runs)
