"""Ray execution details that a sweep's correctness depends on."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

# A Tune trial runs in a working directory of its own: it must still see the driver's cache
# and data directories, or every trial rebuilds indexes and training sets in an empty cache.
PROBE = """
import json, os, sys
import ray.tune
from orchestrator.core.execution import init_ray
from workloads.core.paths import cache_dir, data_dir

def trial(config):
    ray.tune.report({"cwd": os.getcwd(), "cache": str(cache_dir()), "data": str(data_dir())})

init_ray(None, num_cpus=1)
result = ray.tune.Tuner(trial, run_config=ray.tune.RunConfig(storage_path=sys.argv[1], verbose=0)).fit()[0].metrics
print(json.dumps({"driver_cache": str(cache_dir()), "driver_data": str(data_dir()),
                  **{k: result[k] for k in ("cwd", "cache", "data")}}))
"""


def test_tune_trials_see_the_drivers_cache_and_data_dirs(tmp_path):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "ORCHESTRATE_CACHE_DIR"}  # the default: ./.orchestrate/cache
    env["ORCHESTRATE_DATA_DIR"] = "data"  # relative to the driver's working directory
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "ray")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(seen["cwd"]).resolve() != work.resolve()  # Tune did move the trial elsewhere
    assert seen["cache"] == seen["driver_cache"] == str((work / ".orchestrate" / "cache").resolve())
    assert seen["data"] == seen["driver_data"] == str((work / "data").resolve())


# What Train V2's PlacementGroupCleaner does at every trial's end: ask the State API, from a
# worker, whether an actor lives. A `ray start` cluster that died without `ray stop` leaves its
# address in <ray tmp>/ray_current_cluster; the State API must still find this Ray, not wait
# on the dead one (it did, and every trial ended 12 s late).
STATE_PROBE = """
import ray
from orchestrator.core.execution import init_ray

init_ray(None, num_cpus=1)

@ray.remote(num_cpus=0)
class Alive:
    def ping(self):
        return True

actor = Alive.remote()
ray.get(actor.ping.remote())

@ray.remote(num_cpus=0)
def state_of(actor_id):
    from ray.util.state import get_actor
    return get_actor(actor_id, timeout=10).state

print(ray.get(state_of.remote(actor._actor_id.hex())))
"""


@pytest.mark.own_ray  # about the local Ray a command starts (tests/conftest.py)
def test_workers_find_this_rays_state_api_despite_a_stale_cluster_address():
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")  # nothing listens there
        env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": str(REPO)}
        env["RAY_ADDRESS"] = "local"  # unset, the stale file is refused in one line (tests/core/test_ray_address.py)
        proc = subprocess.run([sys.executable, "-c", STATE_PROBE], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1] == "ALIVE"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
