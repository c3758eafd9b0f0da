"""docs/cluster.md's "Step by step", executed line by line on a real local multi-node Ray: a
CPU-less head and two worker nodes that declare a GPU (ORCHESTRATE_FAKE_GPU_DEVICE=cpu lets a
trial placed on one train on the CPU). The sweep names no address: it must join the head's Ray,
and every trial's Train worker must run on a worker node, none on the head."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, mlflow_runs, run_cli, stop_cluster, sweep_yaml

pytestmark = [pytest.mark.slow, pytest.mark.own_ray]  # a cluster of its own (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
RAY = [sys.executable, "-m", "ray.scripts.scripts"]


def guide_lines() -> list[str]:
    """The commands of the "Step by step" block, one per line, comments dropped."""
    text = (REPO / "docs" / "cluster.md").read_text()
    block = text.split("## Step by step", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [" ".join(shlex.split(line, comments=True)) for line in block.splitlines() if shlex.split(line, comments=True)]


def test_the_step_by_step_guide_runs_a_sweep_on_the_clusters_gpu_workers(tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    ray_tmp = Path(f"/tmp/rg{free_port()}")  # short: Ray's socket paths live under it
    # The head writes its address to $RAY_TMPDIR/ray/ray_current_cluster, where the sweep (and
    # `ray status`) look for it with no flag, as on a user's head in /tmp/ray; a user's shell
    # has no RAY_ADDRESS (tests/conftest.py sets "local"). The auth mode is cluster.yaml's.
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ORCHESTRATE_FAKE_GPU_DEVICE", "cpu")
    shared = tmp_path / "shared"
    shared.mkdir()
    spec = sweep_yaml(tmp_path / "guide.yaml", tiny_model_dir, "tiny-guide", [{"ranking": "pointwise", "contrastive": "scl"}],
                      trials_per_cell=1)
    config = yaml.safe_load(spec.read_text())
    config["base"]["resources"]["use_gpu"] = True  # as doc19: trials go to GPU nodes or not at all
    spec.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    port, dashboard = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}

    def ray_up():  # a CPU-less head and two GPU workers, as cluster.yaml's
        head = subprocess.run(RAY + ["start", "--head", f"--port={port}", "--num-cpus=0", "--dashboard-host=127.0.0.1",
                                     f"--dashboard-port={dashboard}", "--disable-usage-stats"], capture_output=True, text=True, env=env)
        assert head.returncode == 0, head.stderr[-2000:]
        for _ in range(2):
            worker = subprocess.run(RAY + ["start", f"--address={address}", "--num-cpus=1", "--num-gpus=1"],
                                    capture_output=True, text=True, env=env)
            assert worker.returncode == 0, worker.stderr[-2000:]

    outputs: dict[str, subprocess.CompletedProcess] = {}

    def orchestrate(words: list[str]):
        words = [{"search_spaces/doc19.yaml": str(spec), "http://127.0.0.1:5000": uri}.get(w, w.replace("/mnt/shared", str(shared)))
                 for w in words]
        proc = run_cli(tmp_path, *words[1:], timeout=900)
        assert proc.returncode == 0, (words, proc.stderr[-3000:])
        outputs[words[1] + (" --dry-run" if "--dry-run" in words else "")] = proc

    def ray_status(words: list[str]):
        proc = subprocess.run(RAY + ["status"], capture_output=True, text=True, env=env, timeout=120)  # no address, as a user's
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "2.0 GPU" in proc.stdout, proc.stdout

    # every line of the block is named here: a new line in the guide fails this test until mapped
    mapping = {
        "ray up cluster.yaml": lambda words: ray_up(),
        "ray attach cluster.yaml -p 5000": lambda words: None,  # a shell on the head: this test runs there
        "cd rerank-lab": lambda words: None,  # the working directory is the test's
        "orchestrate": orchestrate,
        "ray status": ray_status,
        "ray down cluster.yaml": lambda words: stop_cluster(port),
    }
    try:
        for line in guide_lines():
            for command in line.split(" && "):
                words = shlex.split(command)
                handler = mapping.get(command) or mapping.get(words[0])
                assert handler is not None, f"docs/cluster.md's step-by-step line has no mapping in this test: {command}"
                handler(words)
                if command.startswith("orchestrate sweep") and "--dry-run" not in command:
                    placed = worker_placement(dashboard)  # before `ray down`: the State API is the head's
    finally:
        stop_cluster(port)
        shutil.rmtree(ray_tmp, ignore_errors=True)

    sweep = outputs["sweep"]
    assert "joined the Ray cluster" not in outputs["sweep --dry-run"].stderr  # a dry run starts no Ray
    # the address the head recorded: its node's IP and port
    joined = rf"^\[ray\] joined the Ray cluster at [\d.]+:{port}: 3 nodes, 2 CPUs, 2 GPUs$"
    assert re.search(joined, sweep.stderr, re.M), sweep.stderr[-3000:]
    _, runs = mlflow_runs(uri, "tiny-guide")
    assert len(runs) == 5 and all(r.info.status == "FINISHED" for r in runs)  # 2 trials, 2 cells, the sweep
    head, workers, train_nodes = placed
    assert len(train_nodes) >= 2 and set(train_nodes) <= workers and head not in train_nodes, placed
    assert {"status", "report"} <= set(outputs)  # each ran and exited 0 (orchestrate above)


def worker_placement(dashboard: int) -> tuple[str, set[str], list[str]]:
    """The head's node id, the worker nodes' ids, and the node of every Train worker the sweep ran (Ray's State API)."""
    from ray.util.state import list_actors, list_nodes

    api = f"http://127.0.0.1:{dashboard}"
    nodes = list_nodes(address=api, detail=True)
    head = next(n.node_id for n in nodes if n.is_head_node)
    workers = {n.node_id for n in nodes if not n.is_head_node}
    actors = list_actors(address=api, filters=[("class_name", "=", "RayTrainWorker")], detail=True, limit=1000)
    return head, workers, [a.node_id for a in actors]

