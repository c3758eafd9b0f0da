"""A spot notice drains the node through Ray's own API, as preempted: orchestrator/core/spot_drain.py
polls the (fake) instance metadata on a worker node and, on the notice, asks Ray's GCS to drain
that node with the preemption reason and the notice's time as the deadline, so Ray Train V2
restarts the trial elsewhere on its preemption budget, not on ``max_failures``."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tests.workloads.training.test_spot_notice as fake_metadata
from orchestrator.core import spot_drain
from orchestrator.core.execution import API_SERVER_ENV
from orchestrator.core.ray_address import free_port
from tests.workloads.training.test_spot_notice import TOKEN, FakeMetadata, metadata  # noqa: F401 (a fixture)
from workloads.training.spot import SpotNotice

REPO = Path(__file__).resolve().parents[2]


def test_the_deadline_is_the_notices_time_else_two_minutes_never_past():
    now = datetime(2026, 11, 27, 5, 28, tzinfo=UTC).timestamp()
    assert spot_drain.deadline_ms({"action": "terminate", "time": "2026-11-27T05:30:00Z"}, now) == 1_795_757_400_000  # 05:30
    assert spot_drain.deadline_ms({"action": "terminate"}, now) == int((now + 120) * 1000)
    assert spot_drain.deadline_ms({"action": "stop", "time": "2026-11-27T05:00:00Z"}, now) == int((now + 1) * 1000)


def test_the_watcher_drains_on_the_notice_and_tries_a_refused_drain_again():
    answers = [None, OSError("no route"), None, {"action": "terminate", "time": "T"}, {"action": "terminate", "time": "T"}]
    drains = []

    def check():
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    def drain(notice):
        drains.append(notice)
        return len(drains) == 2  # the GCS refuses the first request

    notice = spot_drain.watch(check, drain, 0.0, threading.Event())
    assert notice == {"action": "terminate", "time": "T"} and len(drains) == 2 and answers == []


def test_the_watcher_reads_the_fake_metadata_and_drains_once(metadata):  # noqa: F811
    drains, stop = [], threading.Event()
    found = {}
    thread = threading.Thread(target=lambda: found.update(notice=spot_drain.watch(
        SpotNotice(metadata).check, lambda n: drains.append(n) or True, 0.02, stop)))
    thread.start()
    time.sleep(0.3)
    assert drains == [] and thread.is_alive()  # 404s: nothing announced, nothing drained
    FakeMetadata.announced.set()
    thread.join(10)
    assert not thread.is_alive() and drains == [{"action": "terminate", "time": "2026-11-27T05:30:00Z"}] == [found["notice"]]
    assert ("PUT", "/latest/api/token") in FakeMetadata.requests and TOKEN


def train_until_preempted(config):
    """Train V2 worker: the first attempt records its node, then fails after 90 s unless it is
    preempted first; a later attempt records its node and ends."""
    import ray.train

    marks = Path(config["marks"])
    node = ray.get_runtime_context().get_node_id()
    first = not (marks / "first").exists()
    (marks / ("first" if first else "second")).write_text(node)
    if first:
        time.sleep(90)
        raise RuntimeError("not preempted within 90 s")
    ray.train.report({"done": 1})


@pytest.mark.slow
def test_a_spot_notice_drains_the_node_as_preempted_and_train_restarts_elsewhere_without_a_failure(metadata, tmp_path,  # noqa: F811
                                                                                                     monkeypatch):
    import ray
    from ray._raylet import GcsClient
    from ray.cluster_utils import Cluster
    from ray.core.generated.common_pb2 import NodeDeathInfo
    from ray.core.generated.gcs_pb2 import GcsNodeInfo
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    # tests/conftest.py's "local" is not for the cluster's processes. Train V2's placement group
    # cleaner (a worker) asks the State API whether its controller lives: point it at this
    # cluster's dashboard, as orchestrator/core/execution.py's init_ray does for a private Ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    dashboard_port = free_port()
    monkeypatch.setenv(API_SERVER_ENV, f"http://127.0.0.1:{dashboard_port}")
    temp_dir = tempfile.mkdtemp(prefix="r55b-", dir="/tmp")  # short: Ray's socket paths must fit
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "temp_dir": temp_dir, "dashboard_host": "127.0.0.1",
                                                            "dashboard_port": dashboard_port})
    workers = [cluster.add_node(num_cpus=1, temp_dir=temp_dir) for _ in range(2)]
    cluster.wait_for_nodes()
    marks = tmp_path / "marks"
    marks.mkdir()
    watcher = None
    try:
        ray.init(address=cluster.address)
        def trainer(attempt):
            return DataParallelTrainer(
                train_until_preempted, train_loop_config={"marks": str(marks)},
                scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                # no retry for a failure: the test fails unless the loss is a preemption
                run_config=RunConfig(name=f"spot-{attempt}", storage_path=str(tmp_path / "store"),
                                     failure_config=FailureConfig(max_failures=0)))

        result = {}
        for attempt in range(2):
            # a second start only when the first run ended before its worker began (Ray's placement
            # group cleaner once read a live controller as dead on a loaded machine): nothing is
            # asserted before the worker's mark, and max_failures=0 stays for the drain
            fit = threading.Thread(target=lambda a=attempt: result.update(fit=trainer(a).fit()), daemon=True)
            fit.start()
            deadline = time.time() + 120
            while not (marks / "first").exists() and fit.is_alive() and time.time() < deadline:
                time.sleep(0.2)
            if (marks / "first").exists() or fit.is_alive():
                break
        assert (marks / "first").exists(), f"the worker never started: {result.get('fit')}"
        node_id = (marks / "first").read_text()
        assert node_id in {w.node_id for w in workers}
        # the watcher for that node, started as cluster.yaml starts it (a node id named: two nodes share this machine)
        env = {**os.environ, "ORCHESTRATE_INSTANCE_METADATA": metadata, "PYTHONPATH": str(REPO)}
        watcher = subprocess.Popen([sys.executable, "-m", "orchestrator.core.spot_drain", "--address", cluster.address,
                                    "--node-id", node_id, "--every", "0.2"], env=env, stderr=open(tmp_path / "watcher.err", "w"))
        time.sleep(3)
        assert ray._private.state.state.get_draining_nodes() == {}  # no notice yet: nothing drained
        # 10 s ahead: well after the watcher's next polls even on a loaded machine (no clamp to now + 1 s)
        notice_time = datetime.fromtimestamp(int(time.time()) + 10, tz=UTC)
        monkeypatch.setattr(fake_metadata, "NOTICE", {"action": "terminate", "time": notice_time.strftime("%Y-%m-%dT%H:%M:%SZ")})
        FakeMetadata.announced.set()
        drained = {}
        while not drained and time.time() < deadline + 60:
            drained = ray._private.state.state.get_draining_nodes()  # what Train V2's preemption watcher polls
            time.sleep(0.2)
        assert list(drained) == [node_id], (tmp_path / "watcher.err").read_text()
        assert drained[node_id] == int(notice_time.timestamp()) * 1000
        fit.join(240)
        assert not fit.is_alive() and result["fit"].error is None
        assert (marks / "second").read_text() != node_id  # restarted on the other node
        # AWS takes the instance: the node's death carries the preemption reason
        cluster.remove_node(next(w for w in workers if w.node_id == node_id), allow_graceful=False)
        gcs, info = GcsClient(address=cluster.address), None
        while time.time() < deadline + 300:
            info = next(n for n in gcs.get_all_node_info(timeout=10).values() if ray.NodeID(n.node_id).hex() == node_id)
            if info.state == GcsNodeInfo.GcsNodeState.DEAD:
                break
            time.sleep(0.5)
        assert info.death_info.reason == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED, str(info.death_info)
    finally:
        if watcher is not None:
            watcher.kill()
            watcher.wait()
        ray.shutdown()
        cluster.shutdown()
