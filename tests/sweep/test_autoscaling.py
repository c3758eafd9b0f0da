"""A sweep on an autoscaling cluster: Ray's fake multi-node provider started from the
repository's own cluster-local.yaml (a head with no CPU, 1-CPU worker nodes started on demand
and removed when idle), as `cluster.yaml`'s autoscaler does with cloud instances."""

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from orchestrator.core import execution
from orchestrator.sweep import tune
from orchestrator.sweep.grid import expand_grid, load_sweep
from tests.helpers import free_port, mlflow_runs, run_cli, stop_cluster, sweep_yaml
from workloads.core.errors import InputError
from workloads.kinds.rerank.spec import TrialSpec
from workloads.models.cross_encoder import CrossEncoder, score_pairs

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.own_ray  # clusters of their own (tests/conftest.py)


def test_trial_capacity_follows_the_autoscalers_limits_not_the_live_nodes(monkeypatch):
    """A head without CPUs and GPU workers scaling from 0: the live cluster holds no trial, the
    autoscaler's limits hold eight (one per g5.xlarge), two per 2-GPU node type."""
    head = {"Alive": True, "Resources": {"CPU": 0.0, "memory": 1e10, "node:__internal_head__": 1.0}}
    monkeypatch.setattr("ray.nodes", lambda: [head])
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 0.0})
    config = {"head_node_type": "head", "max_workers": 10, "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 8},
        "two_gpus": {"resources": {"CPU": 8, "GPU": 2}, "max_workers": 4}}}
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: config)
    spec = TrialSpec.model_validate({"name": "t", "data": {"collection": "beir/scifact"}, "training_data": {"size": 8},
                                     "model": {"name": "m"}, "resources": {"cpus_per_worker": 4, "use_gpu": True}})
    capacity = execution.trial_capacity(spec)
    # the roomiest type first (2 per node x 4 nodes), then 6 of the 8 gpu_workers (max_workers 10 in all)
    assert capacity.trials == 14 and capacity.source == "the autoscaler's limits: 4 x two_gpus, 6 x gpu_worker"
    two_workers = spec.model_copy(update={"resources": spec.resources.model_copy(update={"workers": 2})})
    assert execution.trial_capacity(two_workers).trials == 7
    no_limit = {"head_node_type": "head", "max_workers": 3, "available_node_types": {
        "head": {"resources": {"CPU": 0}}, "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}}}}
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: no_limit)
    assert execution.trial_capacity(spec).trials == 3  # a type without max_workers: up to the cluster's (Ray's default)
    capped = {"available_node_types": {"gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": execution.UNLIMITED_NODES}},
              "max_resources": {"GPU": 5}}  # autoscaler v2: unlimited groups, a cluster-wide GPU cap
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: capped)
    assert execution.trial_capacity(spec).trials == 5
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: {"available_node_types": {
        "gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 0}}})
    assert execution.cluster_has_gpu() is False  # a GPU type that may start no node
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: {})
    assert execution.trial_capacity(spec).trials == 1  # no autoscaler, no CPU: one at a time (never 0)
    assert execution.cluster_has_gpu() is False
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: config)
    assert execution.cluster_has_gpu() is True  # GPU nodes that do not exist yet: trainers still ask for a GPU


@pytest.fixture()
def fake_autoscaling_cluster(tmp_path, monkeypatch):
    port = free_port()
    config = yaml.safe_load((REPO / "cluster-local.yaml").read_text())
    config["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    path = tmp_path / "cluster-local.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # loopback only (see test_cluster.two_node_cluster)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # tests/conftest.py's "local": not for the cluster's processes
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
    head = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--num-cpus=0",
                           f"--autoscaling-config={path}", "--dashboard-host=127.0.0.1",
                           "--dashboard-port", str(free_port()), "--disable-usage-stats"],
                          capture_output=True, text=True, env=env)
    assert head.returncode == 0, head.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_cluster(port)


def _worker_nodes(address: str, seen: list, stop: threading.Event) -> None:
    import ray

    while not stop.is_set():
        seen.append(sum(1 for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0))
        time.sleep(1)


@pytest.mark.slow
def test_a_sweep_scales_the_cluster_up_runs_trials_side_by_side_and_the_nodes_go_when_idle(
        fake_autoscaling_cluster, tmp_path, tiny_model_dir, scifact_dir):
    import ray

    address = fake_autoscaling_cluster
    ray.init(address=address)
    try:
        assert [n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]] == [0]  # only the CPU-less head
        seen, stop = [], threading.Event()
        watcher = threading.Thread(target=_worker_nodes, args=(address, seen, stop), daemon=True)
        watcher.start()
        # one cell of two trials: side by side, a winner kept and a loser's checkpoints removed
        spec = sweep_yaml(tmp_path / "autoscaling.yaml", tiny_model_dir, "tiny-autoscaling", [{"ranking": "pointwise"}],
                          augmentations=({"method": "none"},))
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--json", "--verbose",
                               "--address", address, "--storage", str(tmp_path / "store"), "--tracking-uri", uri],
                              capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ), timeout=1500)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "up to 2 at a time (the autoscaler's limits: 2 x cpu_worker)" in proc.stderr
        assert json.loads(proc.stdout)["trials_to_run"] == 0
        client, runs = mlflow_runs(uri, "tiny-autoscaling")
        assert len(runs) == 4 and all(r.info.status == "FINISHED" for r in runs)  # 1 sweep + 1 cell + 2 trials
        trials = sorted((r.info.start_time, r.info.end_time) for r in runs if r.data.tags.get("rerank_lab.kind") == "trial")
        # two 1-CPU trials at once on 1-CPU nodes: on two nodes the autoscaler started for them
        assert any(later[0] < earlier[1] for earlier, later in zip(trials, trials[1:])), trials
        assert max(seen) == 2
        # storage.keep: winners: the losers' checkpoints are gone, each winner's model is its cell's artifact
        cells = [r for r in runs if r.data.tags.get("rerank_lab.kind") == "cell"]
        winners = {client.get_run(c.data.tags["rerank_lab.winner"]).info.run_name for c in cells}
        kept = {d.name for d in (tmp_path / "store" / "tiny-autoscaling" / "ray").iterdir() if any(d.glob("epoch-*"))}
        assert kept == winners and len(kept) == 1
        _assert_models_load_from_the_artifact_store(client, uri, cells)
        status = run_cli(tmp_path, "status", str(spec), "--json", "--storage", str(tmp_path / "store"), "--tracking-uri", uri)
        disk = json.loads(status.stdout)
        assert disk["disk_trials"] == 1 and disk["disk_bytes"] == sum(
            f.stat().st_size for name in kept for f in (tmp_path / "store" / "tiny-autoscaling" / "ray" / name).rglob("*")
            if f.is_file())
        deadline = time.time() + 120
        while time.time() < deadline and seen[-1] != 0:
            time.sleep(2)
        stop.set()
        watcher.join()
        assert seen[-1] == 0  # idle worker nodes are removed: the head alone again
    finally:
        ray.shutdown()


def _assert_models_load_from_the_artifact_store(client, uri: str, cells) -> None:
    """How a user loads a cell's winner back for inference (docs/cluster.md): the artifact alone,
    scoring exactly as the winner's checkpoint does, with no optimizer state logged."""
    import mlflow


    for cell in cells:
        winner = client.get_run(cell.data.tags["rerank_lab.winner"])
        path = mlflow.artifacts.download_artifacts(run_id=cell.info.run_id, artifact_path="model",
                                                   tracking_uri=uri)
        assert not (Path(path) / "training_state.pt").exists()
        pairs = (["what is a cell"] * 2, ["a cell is the unit of life", "a prison room"])
        scores = [score_pairs(CrossEncoder.from_pretrained(where), *pairs, 2, torch.device("cpu"), precision="fp32")
                  for where in (path, winner.data.tags["best_checkpoint"])]
        assert scores[0] == scores[1]
        assert cell.data.tags["rerank_lab.model"] == winner.info.run_id


@pytest.mark.slow
def test_a_node_removed_mid_epoch_the_trial_resumes_on_another_from_its_in_epoch_checkpoint(
        tmp_path, tiny_model_dir, scifact_dir, monkeypatch):
    """A spot node preempted while it trains: Ray's local multi-node cluster (a CPU-less head,
    two 1-CPU nodes) loses the node that runs the trial's worker after an in-epoch checkpoint;
    the trial goes on on the other node after the saved step, the sweep ends with exact counts
    and one MLflow run per trial."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # tests/conftest.py's "local": not for the nodes' processes
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    spec = tmp_path / "preempted.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "tiny-preempted",
        "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                 "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
                 # 700 steps of batch 2, state saved every 8: the node goes inside the epoch (10 s here). (With
                 # 48 steps of 8 the epoch took a second in CI and ended before the node was removed.)
                 "optimization": {"epochs": 1, "batch_size": 2, "checkpoint_every": {"steps": 8}},
                 "resources": {"workers": 1, "cpus_per_worker": 1, "max_failures": 2}},
        "grid": {"models": [str(tiny_model_dir)], "max_length": 64, "losses": [{"ranking": "pointwise"}],
                 "augmentations": [{"method": "none"}], "sizes": [1400]},
        "search": {"trials_per_cell": 1, "pruner": "none"}, "max_failures": 2}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    in_epoch = None
    try:
        ray.init(address=cluster.address)
        driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--json", "--verbose",
                                   "--address", cluster.address, "--storage", str(tmp_path / "store"), "--tracking-uri", uri],
                                  stdout=subprocess.PIPE, stderr=open(tmp_path / "driver.err", "w"), text=True, cwd=tmp_path)
        deadline = time.time() + 900
        while time.time() < deadline and driver.poll() is None:
            found = list((tmp_path / "store").rglob("in-epoch-checkpoint/training_state.pt"))
            if found:
                in_epoch = found[0]
                break
            time.sleep(0.05)
        assert in_epoch is not None, (tmp_path / "driver.err").read_text()[-3000:]
        running = [a.node_id for a in list_actors(filters=[("state", "=", "ALIVE")]) if "TrainWorker" in a.class_name]
        node = next(w for w in workers if w.node_id in running)
        cluster.remove_node(node, allow_graceful=False)  # preempted: no warning, its processes killed
        cluster.add_node(num_cpus=1)  # the autoscaler's replacement
        out, _ = driver.communicate(timeout=1200)
        err = (tmp_path / "driver.err").read_text()
        assert driver.returncode == 0, err[-3000:]
        assert json.loads(out)["trials_to_run"] == 0
        assert "resumed inside epoch 1 after step" in err, err[-3000:]
        _, runs = mlflow_runs(uri, "tiny-preempted")
        assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)  # sweep, cell, trial: no duplicate
        assert len({r.data.tags["rerank_lab.trial_key"] for r in runs}) == 3
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_doc19_on_cluster_yaml_runs_eight_trials_at_once_though_no_gpu_node_is_up(monkeypatch):
    head = {"Alive": True, "Resources": {"memory": 1e10, "node:__internal_head__": 1.0}}
    monkeypatch.setattr("ray.nodes", lambda: [head])
    monkeypatch.setattr("ray.cluster_resources", lambda: {})
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: yaml.safe_load((REPO / "cluster.yaml").read_text()))
    cell = expand_grid(load_sweep(REPO / "search_spaces" / "doc19.yaml"))[0]
    capacity = execution.trial_capacity(cell.spec)
    assert (capacity.trials, capacity.source) == (8, "the autoscaler's limits: 8 x gpu_worker")
    execution.check_resources(cell.spec)  # a g5.xlarge holds a 4-CPU, 1-GPU worker: no refusal


class _Process:
    def __init__(self, *command: str):
        self.info = {"cmdline": list(command)}

    def cwd(self) -> str:
        return "/"


def test_limits_that_cannot_be_read_are_said_and_never_taken_for_the_live_nodes(monkeypatch, tmp_path):
    """KubeRay (the head runs no monitor: its autoscaler has a container of its own), a driver
    off the head, Ray Client: the limits are unknown. The GPU workers scale from 0, so the live
    cluster has no GPU: no "no GPU" refusal, one line asking for a setting, and the setting
    (search.max_concurrent_trials, or --max-concurrent over it) is the concurrency."""
    # isort: off
    import ray  # first: psutil is Ray's vendored copy (on the path once ray is imported)
    import psutil
    # isort: on


    monkeypatch.setattr("ray.get_runtime_context", lambda: type("Context", (), {"gcs_address": "10.0.0.1:6379"})())
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"available_node_types": {"gpu": {"resources": {"GPU": 1}, "max_workers": 3}}}))
    v2 = "/ray/autoscaler/v2/monitor.py"
    for processes, expected in [
        # autoscaler v2 started by `ray start --autoscaling-config` (RAY_enable_autoscaler_v2=1): its cluster file
        ([_Process("python", v2, "--gcs-address=10.0.0.1:6379", f"--autoscaling-config={cluster_file}")],
         {"available_node_types": {"gpu": {"resources": {"GPU": 1}, "max_workers": 3}}}),
        # the head's monitor without a cluster file: no autoscaler at all (a local Ray, a fixed cluster)
        ([_Process("python", "/ray/autoscaler/_private/monitor.py", "--gcs-address=10.0.0.1:6379")], {}),
        # another cluster's monitor, the log monitor: nothing of this cluster's here
        ([_Process("python", v2, "--gcs-address=10.0.0.1:6380"),
          _Process("python", "/ray/_private/log_monitor.py", "--gcs-address=10.0.0.1:6379")], None)]:
        monkeypatch.setattr(psutil, "process_iter", lambda attrs, found=processes: iter(found))
        config = execution._monitor_cluster_file()
        if expected is None:
            assert set(config) == {execution.UNREADABLE} and "no autoscaler process" in config[execution.UNREADABLE]
        else:
            assert config == expected
    monkeypatch.setattr(execution, "_reported_node_groups", lambda: {})
    monkeypatch.setattr(execution, "_monitor_cluster_file", lambda: {})
    monkeypatch.setattr(execution, "_ray_client", lambda: True)
    assert "Ray Client" in execution.limits_unreadable()
    monkeypatch.setattr(execution, "_ray_client", lambda: False)
    assert execution.limits_unreadable() is None

    # doc19 (use_gpu: true) on a cluster whose GPU workers scale from 0 and whose limits cannot be read
    head = {"Alive": True, "Resources": {"CPU": 8.0, "memory": 1e10, "node:__internal_head__": 1.0}}
    monkeypatch.setattr(ray, "nodes", lambda: [head])
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0})
    why = "no autoscaler process of this cluster on this machine"
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: {execution.UNREADABLE: why})
    sweep = load_sweep(REPO / "search_spaces" / "doc19.yaml")
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    execution.check_resources(cells[0].spec)  # not "has no GPU": that would be a guess
    capacity = execution.trial_capacity(cells[0].spec)
    assert capacity.unreadable == why and capacity.trials == 1  # the live nodes' number, flagged: never run on
    with pytest.raises(InputError) as refused:
        tune._max_concurrent(sweep, cells)
    line = str(refused.value)
    assert "\n" not in line and why in line and "search.max_concurrent_trials" in line and "--max-concurrent" in line
    assert "no GPU" not in line
    capped = sweep.model_copy(update={"search": sweep.search.model_copy(update={"max_concurrent_trials": 6})})
    assert tune._max_concurrent(capped, cells) == (
        6, f"search.max_concurrent_trials; the autoscaler's limits could not be read: {why}")
    assert tune._max_concurrent(capped, cells, 3) == (3, f"--max-concurrent; the autoscaler's limits could not be read: {why}")
    # the limits read: the flag still wins, with nothing to say about them
    monkeypatch.setattr(execution, "_autoscaling_config", lambda: yaml.safe_load((REPO / "cluster.yaml").read_text()))
    assert tune._max_concurrent(capped, cells, 3) == (3, "--max-concurrent")
    assert tune._max_concurrent(sweep, cells) == (8, "the autoscaler's limits: 8 x gpu_worker")


@pytest.mark.slow
def test_a_head_whose_autoscaler_is_out_of_reach_asks_for_a_setting_then_runs_at_it(tmp_path, tiny_model_dir, scifact_dir,
                                                                                    monkeypatch):
    """KubeRay's head as the driver sees it: `ray start --head --no-monitor` (the autoscaler runs
    elsewhere). Without a setting the sweep refuses in one line before anything is written;
    with --max-concurrent 2 it runs two trials at a time and says the limits were not read."""
    port = free_port()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # loopback only (see test_cluster.two_node_cluster)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # tests/conftest.py's "local": not for the cluster's processes
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--num-cpus=2",
                           "--no-monitor", "--dashboard-host=127.0.0.1", "--dashboard-port", str(free_port()),
                           "--disable-usage-stats"], capture_output=True, text=True, env=env)
    assert head.returncode == 0, head.stderr[-2000:]
    try:
        # one cell, one trial: the setting is what is checked (the Tune run's cap), not trials side by side
        spec = sweep_yaml(tmp_path / "unread.yaml", tiny_model_dir, "tiny-unread", [{"ranking": "pointwise"}], trials_per_cell=1,
                          augmentations=({"method": "none"},))
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        common = ["--address", f"127.0.0.1:{port}", "--storage", str(tmp_path / "store"), "--tracking-uri", uri]
        refused = run_cli(tmp_path, "sweep", str(spec), *common)
        assert refused.returncode == 2, refused.stderr[-3000:]
        said = [line for line in refused.stderr.splitlines() if "could not be read" in line]
        assert len(said) == 1 and "no autoscaler process" in said[0] and "--max-concurrent" in said[0], refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr and not mlflow_runs(uri, "tiny-unread")[1]
        ran = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec), "--json", "--verbose",
                              "--max-concurrent", "2", *common], capture_output=True, text=True, cwd=tmp_path, timeout=1500)
        assert ran.returncode == 0, ran.stderr[-3000:]
        said = [line for line in ran.stderr.splitlines() if "could not be read" in line]
        assert len(said) == 1 and "up to 2 trial(s) at a time from --max-concurrent; the autoscaler's limits could not be read" \
            in said[0] and "use_gpu: auto sees no live GPU" in said[0], ran.stderr[-3000:]
        assert "up to 2 at a time (--max-concurrent)" in ran.stderr
        assert json.loads(ran.stdout)["trials_to_run"] == 0
        tuners = list((tmp_path / "store" / "tiny-unread" / "ray").glob("tune-*/tuner.pkl"))
        assert [pickle.loads(t.read_bytes())["_tune_config"].max_concurrent_trials for t in tuners] == [2]
    finally:
        stop_cluster(port)
