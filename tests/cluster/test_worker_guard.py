"""A GPU worker whose setup keeps failing is not relaunched forever: cluster/node-setup.sh records
each failure on the shared volume and says why; cluster/worker_guard.py, on the head, sets every
worker type's max_workers to 0 in the autoscaler's config once 3 fall within two hours (Ray's
autoscaler reads that file again on every update and launches nothing beyond max_workers)."""

import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_node_setup import node  # noqa: F401 (the fixture: node-setup.sh with stand-ins)

REPO = Path(__file__).resolve().parents[2]

# The autoscaler's own way of running a setup command (Ray's SSHCommandRunner in the monitor process
# on the head, whose stdout and stderr are monitor.out and monitor.err; login shells, its default):
# the command's output goes to them
AUTOSCALER_RUNS = """import sys
from ray.autoscaler._private.command_runner import is_using_login_shells
from ray.autoscaler._private.subprocess_output_util import run_cmd_redirected
try:
    run_cmd_redirected(sys.argv[1:], use_login_shells=is_using_login_shells())
except Exception as error:
    print("setup command failed:", error)
"""


@pytest.fixture(scope="module")
def guard():
    spec = importlib.util.spec_from_file_location("worker_guard", REPO / "cluster" / "worker_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def bootstrap_config(tmp_path):
    """What `ray up` writes to the head as ~/ray_bootstrap_config.yaml (prepared, not bootstrapped: no AWS here)."""
    from ray.autoscaler._private.util import prepare_config

    config = prepare_config(yaml.safe_load((REPO / "cluster.yaml").read_text()))
    path = tmp_path / "ray_bootstrap_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def failure_line(when: float, host: str = "ip-10-0-0-1") -> str:
    # the line node-setup.sh appends: epoch seconds first
    return f"{int(when)} 2026-11-27T05:00:00+00:00 {host} step 'check the GPU driver' exit 1"


def test_node_setup_writes_the_line_the_guard_reads():
    script = (REPO / "cluster" / "node-setup.sh").read_text()
    assert re.search(r'record="\$\(date \+%s\) .*"', script) and 'echo "$record" >> "$failures"' in script
    assert 'echo "rerank-lab setup failure record: $record" >&2' in script
    assert 'failures="$shared/cluster/worker-setup-failures.log"' in script
    assert 'default=Path("/mnt/shared/cluster/worker-setup-failures.log")' in (REPO / "cluster" / "worker_guard.py").read_text()
    # the failing step is named on stderr, which Ray's autoscaler logs on the head
    assert "setup FAILED on $(hostname) at step '$step'" in script and "trap 'on_error $?' ERR" in script


def test_two_failures_leave_the_workers_alone(guard, bootstrap_config, tmp_path):
    now = time.time()
    log = tmp_path / "failures.log"
    log.write_text("\n".join([failure_line(now - 60), failure_line(now - 30), failure_line(now - 3 * 3600)]) + "\n")
    before = bootstrap_config.read_text()
    assert guard.check_once(log, bootstrap_config, 3, 7200, now) is False
    assert bootstrap_config.read_text() == before


def test_a_third_failure_stops_further_launches(guard, bootstrap_config, tmp_path):
    from ray.autoscaler._private.util import validate_config

    now = time.time()
    log = tmp_path / "failures.log"
    log.write_text("\n".join(failure_line(now - s) for s in (90, 60, 30)) + "\n")
    assert guard.check_once(log, bootstrap_config, 3, 7200, now) is True
    config = yaml.safe_load(bootstrap_config.read_text())
    validate_config(config)  # the autoscaler takes the new file
    assert config["available_node_types"]["gpu_worker"]["max_workers"] == 0
    original = yaml.safe_load(bootstrap_config.with_name("ray_bootstrap_config.yaml.before-guard").read_text())
    assert original["available_node_types"]["gpu_worker"]["max_workers"] == 8
    assert guard.check_once(log, bootstrap_config, 3, 7200, now) is False  # once is enough


def test_the_autoscaler_launches_nothing_for_a_guarded_config(guard, bootstrap_config, tmp_path):
    # Ray's own scheduler, asked for 8 GPUs by pending trials, with the config before and after the guard
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler

    def launches(path: Path) -> int:
        config = yaml.safe_load(path.read_text())
        scheduler = ResourceDemandScheduler(provider=None, node_types=config["available_node_types"], max_workers=config["max_workers"],
                                            head_node_type=config["head_node_type"], upscaling_speed=config["upscaling_speed"])
        to_launch, _ = scheduler.get_nodes_to_launch(
            nodes=[], launching_nodes={}, resource_demands=[{"CPU": 4, "GPU": 1}] * 8, unused_resources_by_ip={},
            pending_placement_groups=[], max_resources_by_ip={}, ensure_min_cluster_size=[], node_availability_summary=None)
        return to_launch.get("gpu_worker", 0)  # (the head it also lists is the running head, not shown here)

    assert launches(bootstrap_config) > 0
    log = tmp_path / "failures.log"
    log.write_text("\n".join(failure_line(time.time() - s) for s in (3, 2, 1)) + "\n")
    assert guard.main(["--failures", str(log), "--config", str(bootstrap_config), "--once"]) == 0
    assert launches(bootstrap_config) == 0


def test_the_guard_runs_as_cluster_yaml_starts_it(tmp_path, bootstrap_config):
    log = tmp_path / "failures.log"
    log.write_text("\n".join(failure_line(time.time() - s) for s in (3, 2, 1)) + "\n")
    command = [sys.executable, str(REPO / "cluster" / "worker_guard.py"), "--failures", str(log),
               "--config", str(bootstrap_config), "--once"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "stopped launching workers (3 worker setups failed within 2 h" in result.stderr


def test_workers_whose_mount_fails_are_counted_from_the_autoscalers_log_and_the_third_stops_launches(
        guard, bootstrap_config, node, tmp_path):  # noqa: F811
    """No shared volume, so no failure log a worker could write: the record the worker prints
    reaches the head's autoscaler log, the guard copies it into the failure log and counts it."""
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    failures = tmp_path / "head-shared" / "cluster" / "worker-setup-failures.log"
    autoscaler_log = guard.AutoscalerLog(logs)

    def a_worker_fails_to_mount(name: str) -> None:
        with open(logs / "monitor.out", "a") as out, open(logs / "monitor.err", "a") as err:
            subprocess.run([sys.executable, "-c", AUTOSCALER_RUNS, "bash", str(node.script), "worker",
                            "fs-12345678.efs.us-east-1.amazonaws.com"], stdout=out, stderr=err, timeout=120,
                           env={**node.env, "MOUNT_FAILS": "1", "NODE_NAME": name})

    for name in ("ip-10-0-1-7", "ip-10-0-2-9"):
        a_worker_fails_to_mount(name)
        assert guard.check_once(failures, bootstrap_config, 3, 7200, autoscaler_log=autoscaler_log) is False
    lines = failures.read_text().splitlines()
    assert [line.split()[2] for line in lines] == ["ip-10-0-1-7", "ip-10-0-2-9"]  # each once, though read twice
    assert all(line.endswith(f"step 'mount the EFS volume fs-12345678.efs.us-east-1.amazonaws.com at {node.shared}' exit 1")
               for line in lines)
    a_worker_fails_to_mount("ip-10-0-3-4")
    assert guard.check_once(failures, bootstrap_config, 3, 7200, autoscaler_log=autoscaler_log) is True
    assert yaml.safe_load(bootstrap_config.read_text())["available_node_types"]["gpu_worker"]["max_workers"] == 0
    assert len(failures.read_text().splitlines()) == 3


def test_a_failure_the_worker_wrote_itself_and_the_guard_read_in_the_log_counts_once(guard, bootstrap_config, tmp_path):
    now = time.time()
    failures = tmp_path / "failures.log"
    lines = [failure_line(now - 90, "ip-a"), failure_line(now - 60, "ip-b")]
    failures.write_text("".join(f"{line}\n" for line in lines))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "monitor.err").write_text("".join(f"rerank-lab setup failure record: {line}\r\n" for line in lines))
    assert guard.check_once(failures, bootstrap_config, 3, 7200, now, guard.AutoscalerLog(logs)) is False
    assert failures.read_text().splitlines() == lines
