"""Which Ray a command runs on (orchestrator.core.ray_address): found as ray.init() finds it,
in the address file under $RAY_TMPDIR, with a real socket for a live cluster."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from orchestrator.core import execution, ray_address
from orchestrator.core.ray_address import ray_address_to_join
from tests.helpers import free_port
from workloads.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def ray_tmp(tmp_path, monkeypatch):
    """Ray's temp directory of this test ($RAY_TMPDIR/ray), as a user's shell has no RAY_ADDRESS."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray"


@pytest.fixture()
def listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_no_cluster_recorded_means_a_private_ray(ray_tmp):
    assert ray_address_to_join(None) is None


def test_a_live_recorded_cluster_is_joined_without_a_flag(ray_tmp, listener):
    (ray_tmp / "ray_current_cluster").write_text(listener)
    assert ray_address_to_join(None) == listener


def test_a_dead_recorded_cluster_is_one_line_naming_the_file_and_the_fix(ray_tmp, monkeypatch):
    monkeypatch.setattr(ray_address, "RAY_CONNECT_TIMEOUT_SECONDS", 1.0)
    dead = f"127.0.0.1:{free_port()}"
    (ray_tmp / "ray_current_cluster").write_text(dead)
    with pytest.raises(InputError) as error:
        ray_address_to_join(None)
    assert str(error.value) == (f"{ray_tmp / 'ray_current_cluster'}: it records the Ray cluster at {dead}, where nothing "
                                "answers within 1 s (Connection refused): a cluster that stopped without `ray stop`; "
                                "run `ray stop` (it removes the file) or pass --address local for a private Ray")
    assert (ray_tmp / "ray_current_cluster").read_text() == dead  # Ray's file: left for `ray stop`


def test_address_local_is_a_private_ray_even_beside_a_live_cluster(ray_tmp, listener, monkeypatch):
    (ray_tmp / "ray_current_cluster").write_text(listener)
    assert ray_address_to_join("local") is None
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert ray_address_to_join(None) is None


def test_a_dead_ray_address_variable_is_named_as_the_variable(ray_tmp, monkeypatch):
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    with pytest.raises(InputError, match=rf"^RAY_ADDRESS={dead}: no Ray cluster answers there"):
        ray_address_to_join(None)


def test_a_gpu_grid_on_a_joined_cluster_without_gpus_never_suggests_the_cpu(monkeypatch):
    spec = SimpleNamespace(name="doc19", resources=SimpleNamespace(use_gpu=True, cpus_per_worker=1))
    monkeypatch.setattr(execution, "largest_node", lambda: {"CPU": 16})
    monkeypatch.setattr(execution, "limits_unreadable", lambda: None)
    monkeypatch.setattr(execution, "joined_cluster", "10.0.0.5:6379")
    with pytest.raises(InputError) as error:
        execution.check_resources(spec)
    assert str(error.value) == ("doc19: resources.use_gpu true: the cluster's largest node has no GPU: a worker could never "
                                "start (check the cluster's GPU worker types (`ray status` lists its nodes and their resources))")
    monkeypatch.setattr(execution, "joined_cluster", None)  # a private Ray on a laptop: the CPU is a choice to offer
    with pytest.raises(InputError, match=r"use_gpu: auto uses one where there is one"):
        execution.check_resources(spec)


AUTH_PROBE = """
from orchestrator.core.execution import init_ray
init_ray("local", num_cpus=1)
"""


@pytest.mark.slow  # a Ray start (a few seconds)
@pytest.mark.own_ray
def test_a_private_ray_leaves_no_auth_token_behind(tmp_path):
    """Ray 2.60's ray.init of a new cluster writes ~/.ray/auth_token unless RAY_AUTH_MODE is set;
    a later `ray start --head` on the machine would turn token auth on while its workers do not."""
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = Path(os.path.realpath("/tmp")) / f"rh{free_port()}"  # short: Ray's socket paths live under it
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env |= {"HOME": str(home), "PYTHONPATH": str(REPO), "RAY_TMPDIR": str(ray_tmp)}
    try:
        proc = subprocess.run([sys.executable, "-c", AUTH_PROBE], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert not (home / ".ray" / "auth_token").exists()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_clusters_set_one_auth_mode_on_head_workers_and_driver():
    """Token auth alike everywhere: a head that enables it while workers do not never gets workers."""
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key] if "bin/ray start " in c]
    assert len(starts) == 2 and all("RAY_AUTH_MODE=disabled " in c for c in starts), starts
    assert "export RAY_AUTH_MODE=disabled' >> ~/.bashrc" in "\n".join(config["head_start_ray_commands"])  # the driver's shells
    manifest = next(d for d in yaml.safe_load_all((REPO / "k8s" / "raycluster.yaml").read_text())
                    if d and d.get("kind") == "RayCluster")["spec"]
    pods = [manifest["headGroupSpec"], *manifest["workerGroupSpecs"]]
    ray_containers = [c for pod in pods for c in pod["template"]["spec"]["containers"] if c["name"].startswith("ray-")]
    assert len(ray_containers) == 1 + len(manifest["workerGroupSpecs"])
    for container in ray_containers:  # the head's container is also where `kubectl exec` runs the driver
        assert {"name": "RAY_AUTH_MODE", "value": "disabled"} in container["env"], container["name"]
