"""A Ray that does not start in time (Ray's own 30 s wait for its node: seen on a 2-core machine
with a second Ray starting beside it) is one line, exit 2, before anything is written."""

from pathlib import Path

import pytest

from orchestrator.core import execution
from tests.helpers import mlflow_runs, run_cli
from workloads.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]
# Ray's own words (ray/_private/node.py raises a bare Exception; services.wait_for_node a TimeoutError)
NODE_TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet failed to "
                  "startup or the GCS has become overloaded.")
WAIT_TIMED_OUT = ("Timed out after 30 seconds while waiting for node to startup. Did not find socket name "
                  "/tmp/ray/session_x/sockets/plasma_store in the list of object store socket names.")


@pytest.fixture
def ray_times_out(monkeypatch):
    import ray

    def timed_out(**kwargs):
        raise Exception(NODE_TIMED_OUT)  # noqa: TRY002 - Ray's own type

    monkeypatch.setattr(ray, "init", timed_out)


def test_a_sweep_whose_ray_does_not_start_says_so_in_one_line_and_writes_no_run(tmp_path, ray_times_out):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(tmp_path, "sweep", REPO / "search_spaces" / "demo.yaml", "--storage", tmp_path / "store",
                   "--tracking-uri", uri)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("error: ray: a private Ray on this machine did not start in time (The current node timed "
                                "out during startup."), lines[-1]
    assert "CPUs): run the same command again" in lines[-1]
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:]
    assert mlflow_runs(uri, "demo")[1] == []  # checked before any run is written


def test_either_of_rays_start_timeouts_names_the_ray_and_the_load(monkeypatch):
    import ray

    for name in ("set_environment_defaults", "pin_storage_paths"):
        monkeypatch.setattr(execution, name, lambda: None)
    monkeypatch.setattr(execution, "worker_env", lambda: {})
    monkeypatch.setattr(execution.os, "getloadavg", lambda: (11.46, 9.0, 7.0))
    monkeypatch.setattr(execution.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray, "init", lambda **kwargs: (_ for _ in ()).throw(TimeoutError(WAIT_TIMED_OUT)))
    with pytest.raises(InputError) as error:
        execution.init_ray("10.0.0.1:6379")
    assert str(error.value) == ("ray: this machine's Ray node, joining the cluster at 10.0.0.1:6379, did not start in time "
                                f"({WAIT_TIMED_OUT[:-1]}; load average 11.5 on 2 CPUs): run the same command again, when the "
                                "machine is less busy (what finished before is kept and reused)")
    monkeypatch.setattr(ray, "init", lambda **kwargs: (_ for _ in ()).throw(Exception("the GCS refused")))
    with pytest.raises(Exception, match="the GCS refused"):  # any other failure is not dressed as a timeout
        execution.init_ray(None)
