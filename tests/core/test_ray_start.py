"""A private Ray that does not start in time (Ray's own 30 s wait for its node: seen on a 2-core
machine with a second Ray starting beside it) is one line, exit 2, before anything is written."""

from pathlib import Path

import pytest

from orchestrator.core import execution
from tests.helpers import mlflow_runs, run_cli
from workloads.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]
# Ray's own words (ray/_private/node.py raises a bare Exception after 30 s)
NODE_TIMED_OUT = ("The current node timed out during startup. This could happen because some of the raylet failed to "
                  "startup or the GCS has become overloaded.")


def _ray_init_raises(monkeypatch, exception: Exception) -> None:
    import ray

    monkeypatch.setattr(ray, "init", lambda **kwargs: (_ for _ in ()).throw(exception))


def test_a_sweep_whose_ray_does_not_start_says_so_in_one_line_and_writes_no_run(tmp_path, monkeypatch):
    _ray_init_raises(monkeypatch, Exception(NODE_TIMED_OUT))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(tmp_path, "sweep", REPO / "search_spaces" / "demo.yaml", "--storage", tmp_path / "store",
                   "--tracking-uri", uri)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("error: ray: a private Ray on this machine did not start in time (The current node timed "
                                "out during startup."), lines[-1]
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:]
    assert mlflow_runs(uri, "demo")[1] == []  # checked before any run is written


@pytest.mark.parametrize("load, advice", [
    (11.46, "load average 11.5 on 2 CPUs): run the same command again when the machine is less busy (what finished "
            "before is kept and reused)"),
    (0.3, "load average 0.3 on 2 CPUs): see why in Ray's logs (/scratch/ray/session_latest/logs: raylet.err, "
          "gcs_server.err)"),
], ids=["busy", "idle"])
def test_the_line_says_how_busy_the_machine_is_and_what_to_do(monkeypatch, load, advice):
    for name in ("set_environment_defaults", "pin_storage_paths"):
        monkeypatch.setattr(execution, name, lambda: None)
    monkeypatch.setattr(execution, "worker_env", lambda: {})
    monkeypatch.setattr(execution.os, "getloadavg", lambda: (load, 9.0, 7.0))
    monkeypatch.setattr(execution.os, "cpu_count", lambda: 2)
    monkeypatch.setenv("RAY_TMPDIR", "/scratch")
    _ray_init_raises(monkeypatch, Exception(NODE_TIMED_OUT))
    with pytest.raises(InputError) as error:
        execution.init_ray("local")
    assert str(error.value) == f"ray: a private Ray on this machine did not start in time ({NODE_TIMED_OUT[:-1]}; {advice}"


def test_other_failures_of_rays_start_are_not_dressed_as_a_timeout(monkeypatch):
    for name in ("set_environment_defaults", "pin_storage_paths"):
        monkeypatch.setattr(execution, name, lambda: None)
    monkeypatch.setattr(execution, "worker_env", lambda: {})
    _ray_init_raises(monkeypatch, Exception("the GCS refused"))
    with pytest.raises(Exception, match="the GCS refused"):
        execution.init_ray("local")
