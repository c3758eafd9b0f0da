"""cluster/node-setup.sh run here with the machine's tools replaced by recording stand-ins (sudo,
apt-get, mount, nvidia-smi, the cluster's python3.X and the .venv's pip and python): the order of its steps, what
a failing worker says and records, the refusal after 3 failures, what the head installs, and the
wheelhouse the head builds once and workers install from only when it is complete for their pins.
Nothing here touches this machine's packages, /etc/fstab or /mnt; the real tools are untested."""

import hashlib
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON = (REPO / "cluster" / "python-version").read_text().strip()  # the cluster's Python, one setting
EFS = "fs-12345678.efs.us-east-1.amazonaws.com"

STUBS = {
    "sudo": 'exec env "$@"',
    "apt-get": 'echo "apt-get $*" >> "$CALLS"',
    "add-apt-repository": 'echo "add-apt-repository $*" >> "$CALLS"',
    "cloud-init": 'echo "cloud-init $*" >> "$CALLS"',
    "systemd-run": 'echo "systemd-run $*" >> "$CALLS"',
    "mount": 'echo "mount $*" >> "$CALLS"; [ -n "$MOUNT_FAILS" ] && exit 32; touch "$MOUNTED_FLAG"',
    "mountpoint": '[ -e "$MOUNTED_FLAG" ]',
    "sleep": 'echo "sleep $*" >> "$CALLS"',
    "hostname": 'echo "${NODE_NAME:-ip-10-0-0-1}"',
    "nvidia-smi": 'echo "nvidia-smi $*" >> "$CALLS"; [ "$DRIVER" = none ] && exit 9; echo "$DRIVER"',
    f"python{PYTHON}": (f'echo "python{PYTHON} $*" >> "$CALLS"; mkdir -p .venv/bin\n'
                   'printf \'#!/bin/sh\\necho "pip $*" >> "$CALLS"; [ "$1" != wheel ] || exit ${PIP_WHEEL_RC:-0}\\n\' > .venv/bin/pip\n'
                   'printf \'#!/bin/sh\\necho "venv-python $*" >> "$CALLS"; exit ${TORCH_RC:-0}\\n\' > .venv/bin/python\n'
                   "chmod +x .venv/bin/pip .venv/bin/python"),
}


@pytest.fixture()
def node(tmp_path):
    """A home with the project's cluster scripts at ~/rerank-lab, the stand-ins first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    scripts = home / "rerank-lab" / "cluster"
    scripts.mkdir(parents=True)
    for script in ("node-setup.sh", "gpu-check.sh", "python-version"):
        (scripts / script).write_text((REPO / "cluster" / script).read_text())
    (home / "rerank-lab" / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())  # the wheelhouse's key
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin", "CALLS": str(tmp_path / "calls"),
           "MOUNTED_FLAG": str(tmp_path / "mounted"), "RERANK_LAB_SHARED": str(shared),
           "RERANK_LAB_FSTAB": str(tmp_path / "fstab"), "DRIVER": "595.58.03"}

    def run(role: str, **extra) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(scripts / "node-setup.sh"), role, EFS], capture_output=True, text=True,
                              env={**env, **extra}, timeout=60)

    def calls() -> list[str]:
        path = Path(env["CALLS"])
        return path.read_text().splitlines() if path.exists() else []

    run.calls, run.shared, run.home, run.fstab = calls, shared, home, tmp_path / "fstab"
    run.env, run.script = env, scripts / "node-setup.sh"
    return run


def first(calls: list[str], prefix: str) -> int:
    return next(i for i, c in enumerate(calls) if c.startswith(prefix))


def test_a_worker_waits_for_apt_mounts_checks_the_driver_then_installs(node):
    result = node("worker")
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    # the package manager's lock first, the mount before anything needs it, the driver before the long install
    assert first(calls, "cloud-init status --wait") < first(calls, "systemd-run") < first(calls, "apt-get")
    assert any("DPkg::Lock::Timeout=900" in c for c in calls if c.startswith("apt-get"))
    venv = first(calls, f"python{PYTHON} -m venv")
    assert first(calls, "mount") < first(calls, "nvidia-smi") < venv < first(calls, "pip install -q -e .")
    assert "pip install -q -e ." in calls and not any("[aws]" in c for c in calls)   # a worker needs no boto3
    assert first(calls, "pip install -q -e .") < first(calls, "venv-python -")          # torch's GPU check after the install
    assert node.fstab.read_text() == f"{EFS}:/ {node.shared} nfs4 nfsvers=4.1,rsize=1048576,wsize=1048576,hard,timeo=600,retrans=2," \
                                     "noresvport,_netdev,nofail 0 0\n"
    assert not (node.shared / "cluster" / "worker-setup-failures.log").exists()
    # a second run (ray up again) adds no second fstab line or environment block
    assert node("worker").returncode == 0
    assert len(node.fstab.read_text().splitlines()) == 1
    bashrc = (node.home / ".bashrc").read_text()
    assert bashrc.count("# rerank-lab (cluster/node-setup.sh)") == 1 and f"ORCHESTRATE_CACHE_DIR={node.shared}/cache" in bashrc


def test_a_worker_with_an_old_driver_fails_before_installing_says_why_and_records_it(node):
    result = node("worker", DRIVER="535.183.01")
    assert result.returncode != 0
    assert "NVIDIA driver 535.183.01" in result.stderr and "older than 580" in result.stderr
    assert "rerank-lab worker setup FAILED on" in result.stderr and "at step 'check the GPU driver'" in result.stderr
    assert not any(c.startswith("pip") for c in node.calls())
    (line,) = (node.shared / "cluster" / "worker-setup-failures.log").read_text().splitlines()
    assert abs(int(line.split()[0]) - time.time()) < 60 and "step 'check the GPU driver'" in line


def test_a_worker_whose_torch_cannot_use_the_gpu_fails_and_records_it(node):
    result = node("worker", TORCH_RC="1")
    assert result.returncode != 0 and "at step 'check that torch uses the GPU'" in result.stderr
    assert len((node.shared / "cluster" / "worker-setup-failures.log").read_text().splitlines()) == 1


def test_a_worker_whose_mount_fails_says_why_and_prints_the_record_the_head_counts(node):
    result = node("worker", MOUNT_FAILS="1", NODE_NAME="ip-10-0-1-7")
    assert result.returncode != 0
    assert f"at step 'mount the EFS volume {EFS} at {node.shared}'" in result.stderr
    assert "does its security group accept NFS (TCP 2049)" in result.stderr
    assert node.calls().count("sleep 10") == 6 and not any(c.startswith(("nvidia-smi", "pip")) for c in node.calls())
    # nothing on the unmounted volume's place; the record goes to stderr, which the autoscaler logs on the head
    assert not (node.shared / "cluster").exists()
    (record,) = [line for line in result.stderr.splitlines() if line.startswith("rerank-lab setup failure record: ")]
    stamp, _, host, rest = record.removeprefix("rerank-lab setup failure record: ").split(" ", 3)
    assert abs(int(stamp) - time.time()) < 60 and host == "ip-10-0-1-7"
    assert rest == f"step 'mount the EFS volume {EFS} at {node.shared}' exit 1"


def test_after_three_recent_failures_a_worker_refuses_at_once(node):
    log = node.shared / "cluster" / "worker-setup-failures.log"
    log.parent.mkdir()
    now = int(time.time())
    log.write_text("".join(f"{t} when ip-10-0-0-{i} step 'x' exit 1\n" for i, t in enumerate((now - 7300, now - 600, now - 300))))
    assert node("worker").returncode == 0  # one stale, two recent: it tries
    log.write_text(log.read_text() + f"{now - 60} when ip-10-0-0-9 step 'x' exit 1\n")
    before = len(node.calls())
    result = node("worker")
    assert result.returncode != 0 and "3 GPU workers failed setup in the last two hours" in result.stderr
    assert not any(c.startswith(("nvidia-smi", "pip")) for c in node.calls()[before:])


def test_the_head_installs_the_aws_extra_and_checks_no_gpu(node):
    result = node("head", DRIVER="none")
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    wheelhouse = node.shared / "wheelhouse" / PYTHON
    assert f"pip install -q --no-index --find-links {wheelhouse} -e .[aws]" in calls
    assert not any(c.startswith(("nvidia-smi", "venv-python")) for c in calls)


def test_scripts_parse():
    for script in ("node-setup.sh", "gpu-check.sh", "service.sh", "mlflow-server.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / "cluster" / script)]).returncode == 0, script
    assert all(os.access(REPO / "cluster" / s, os.X_OK) for s in ("service.sh", "mlflow-server.sh"))


def test_a_node_installs_the_python_that_cluster_python_version_names(node):
    (node.home / "rerank-lab" / "cluster" / "python-version").write_text("3.13\n")
    result = node("head", DRIVER="none")
    assert result.returncode != 0 and "at step 'install the project" in result.stderr  # no python3.13 stand-in here
    calls = node.calls()
    install = "apt-get -o DPkg::Lock::Timeout=900 -y -q install python3.13 python3.13-venv"
    assert install in calls and first(calls, "add-apt-repository -y -n ppa:deadsnakes/ppa") < calls.index(install)


def test_the_cluster_and_its_image_run_one_python():
    """cluster/python-version is the setting; k8s/Dockerfile's base image defaults to the same
    Python (Ray's tag py311 for 3.11), and its build refuses a base image of another one."""
    dockerfile = (REPO / "k8s" / "Dockerfile").read_text()
    assert f"ARG RAY_PYTHON=py{PYTHON.replace('.', '')}\n" in dockerfile
    assert "FROM rayproject/ray:2.60.0-${RAY_PYTHON}\n" in dockerfile
    assert '= "$(cat /home/ray/rerank-lab/cluster/python-version)"' in dockerfile
    assert PYTHON in ("3.11", "3.12", "3.13")  # what pyproject.toml's requires-python allows


def wheelhouse_key(home: Path) -> str:
    """What cluster/node-setup.sh writes in the wheelhouse's COMPLETE, computed by hand."""
    digest = hashlib.sha256((home / "rerank-lab" / "pyproject.toml").read_bytes()).hexdigest()
    return f"python {PYTHON} {platform.machine()} pyproject.toml {digest}"


def test_the_head_builds_the_wheelhouse_once_installs_from_it_and_rebuilds_when_the_pins_change(node):
    wheelhouse = node.shared / "wheelhouse" / PYTHON
    result = node("head", DRIVER="none")
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    build = f"pip wheel -q --wheel-dir {wheelhouse} .[aws] setuptools>=68 pip"
    assert calls.count(build) == 1
    assert calls.index(build) < calls.index(f"pip install -q --no-index --find-links {wheelhouse} --upgrade pip")
    assert not any(c.startswith("pip install") and "--no-index" not in c for c in calls)   # the registry only through the build
    assert (wheelhouse / "COMPLETE").read_text() == wheelhouse_key(node.home) + "\n"
    assert list(wheelhouse.iterdir()) == [wheelhouse / "COMPLETE"]   # no temporary marker left
    # ray up again: the marker matches this pyproject.toml, nothing is rebuilt
    before = len(node.calls())
    result = node("head", DRIVER="none")
    assert result.returncode == 0 and f"the wheelhouse {wheelhouse} is complete for this pyproject.toml: not rebuilt" in result.stdout
    assert not any(c.startswith("pip wheel") for c in node.calls()[before:])
    # a changed pin: rebuilt, the marker follows
    pyproject = node.home / "rerank-lab" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"torch==2.13.0"', '"torch==2.13.1"'))
    before = len(node.calls())
    assert node("head", DRIVER="none").returncode == 0
    assert node.calls()[before:].count(build) == 1 and (wheelhouse / "COMPLETE").read_text() == wheelhouse_key(node.home) + "\n"


def test_a_worker_installs_from_a_complete_wheelhouse_without_the_registry(node):
    assert node("head", DRIVER="none").returncode == 0
    before = len(node.calls())
    result = node("worker")
    assert result.returncode == 0, result.stderr
    wheelhouse = node.shared / "wheelhouse" / PYTHON
    assert f"rerank-lab: installing from the wheelhouse {wheelhouse} (no registry)\n" in result.stdout
    installs = [c for c in node.calls()[before:] if c.startswith("pip")]
    assert installs == [f"pip install -q --no-index --find-links {wheelhouse} --upgrade pip",
                        f"pip install -q --no-index --find-links {wheelhouse} -e ."]


@pytest.mark.parametrize("marker", [None, "python 3.11 x86_64 pyproject.toml 0123abcd\n"], ids=["half-built", "other-pins"])
def test_a_worker_ignores_a_wheelhouse_not_complete_for_its_pins_and_uses_the_registry(node, marker):
    wheelhouse = node.shared / "wheelhouse" / PYTHON
    wheelhouse.mkdir(parents=True)
    (wheelhouse / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_text("half of it")
    if marker:
        (wheelhouse / "COMPLETE").write_text(marker)
    result = node("worker")
    assert result.returncode == 0, result.stderr
    assert (f"rerank-lab: installing from the registry: no complete wheelhouse for this pyproject.toml at {wheelhouse}\n"
            in result.stdout)
    assert [c for c in node.calls() if c.startswith("pip")] == ["pip install -q --upgrade pip", "pip install -q -e ."]


def test_a_failed_wheelhouse_build_fails_the_head_and_leaves_no_marker(node):
    result = node("head", DRIVER="none", PIP_WHEEL_RC="1")
    wheelhouse = node.shared / "wheelhouse" / PYTHON
    assert result.returncode != 0 and f"at step 'build the wheelhouse {wheelhouse}'" in result.stderr
    assert not (wheelhouse / "COMPLETE").exists()
    assert "installing from the registry" in node("worker").stdout   # so no worker takes it for complete
