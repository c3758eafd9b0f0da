"""The cluster's Python and the driver's: one line when their minor versions differ (Ray refuses
such a driver), from the live cluster where it answers, else, in a dry run, from the setting
the cluster is set up with (cluster/python-version)."""

import os
import sys

import pytest

from orchestrator.core import cluster_python, execution
from orchestrator.core.cluster_python import check_driver_python, driver_python, live_cluster_python
from tests.helpers import free_port
from workloads.core.errors import InputError

MINE = f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture()
def setting(tmp_path, monkeypatch):
    """cluster/python-version saying ``version``."""
    def write(version: str):
        path = tmp_path / "python-version"
        path.write_text(f"{version}\n")
        monkeypatch.setattr(cluster_python, "CLUSTER_PYTHON_FILE", path)
    return write


def test_the_drivers_python_is_major_dot_minor():
    assert driver_python() == MINE


def test_a_live_cluster_of_another_python_is_one_line(monkeypatch, setting):
    setting(MINE)  # the live cluster's answer wins over the setting
    monkeypatch.setattr(cluster_python, "live_cluster_python", lambda address: "3.99")
    with pytest.raises(InputError) as error:
        check_driver_python("10.0.0.1:6379")
    assert str(error.value) == (f"10.0.0.1:6379: the cluster runs Python 3.99 but this driver runs Python {MINE} ({sys.executable}): "
                                "Ray refuses a driver of another minor version; run orchestrate from a Python 3.99 venv")
    monkeypatch.setattr(cluster_python, "live_cluster_python", lambda address: MINE)
    check_driver_python("10.0.0.1:6379")


def test_a_dry_run_of_a_cluster_that_does_not_answer_reads_the_setting(monkeypatch, setting):
    setting("3.99")
    address = f"127.0.0.1:{free_port()}"
    assert live_cluster_python(address) is None  # nothing listens there
    with pytest.raises(InputError, match=r"^cluster/python-version: the cluster runs Python 3\.99 but this driver runs Python"):
        check_driver_python(address, dry_run=True)
    check_driver_python(address)  # a sweep's start: check_ray_address has said it does not answer; nothing to compare
    check_driver_python(None, dry_run=True)  # a local Ray runs the driver's Python
    monkeypatch.setenv("RAY_ADDRESS", address)
    with pytest.raises(InputError, match="3.99"):
        check_driver_python(None, dry_run=True)
    setting(MINE)
    check_driver_python(address, dry_run=True)


def test_a_ray_client_address_is_not_asked():
    assert live_cluster_python("ray://127.0.0.1:10001") is None


@pytest.mark.slow
def test_a_live_cluster_reports_the_python_it_was_started_with():
    """The session's Ray head ($RAY_ADDRESS, started by this interpreter) is asked through its GCS."""
    assert live_cluster_python(os.environ["RAY_ADDRESS"]) == MINE
    check_driver_python(os.environ["RAY_ADDRESS"], dry_run=True)


def test_rays_own_version_check_at_connection_is_one_line(monkeypatch):
    """Where the cluster could not be asked beforehand, Ray's refusal at ray.init (a message of many lines) becomes one."""
    import ray

    for name in ("set_environment_defaults", "pin_storage_paths"):
        monkeypatch.setattr(execution, name, lambda: None)
    monkeypatch.setattr(execution, "worker_env", lambda: {})

    def refuse(**kwargs):
        raise RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.60.0\n    Python: 3.99.1\n"
                           "This process on node 10.0.0.2 was started with:\n    Ray: 2.60.0\n    Python: 3.11.7\n")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(InputError) as error:
        execution.init_ray("10.0.0.1:6379")
    assert str(error.value) == ("10.0.0.1:6379: Version mismatch: The cluster was started with: Ray: 2.60.0 Python: 3.99.1 This "
                                "process on node 10.0.0.2 was started with: Ray: 2.60.0 Python: 3.11.7: run orchestrate from the "
                                "cluster's Python (cluster/python-version) and Ray")
    monkeypatch.setattr(ray, "init", lambda **kwargs: (_ for _ in ()).throw(RuntimeError("something else")))
    with pytest.raises(RuntimeError, match="something else"):
        execution.init_ray("10.0.0.1:6379")
