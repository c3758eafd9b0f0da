"""The head's services (cluster/service.sh: MLflow, the worker guard) started by the very commands
in cluster.yaml, run here through the wrapper Ray's SSH command runner puts around every head
command (`bash --login -c -i 'source ~/.bashrc; ... && (cmd)'`, Ray's own function), with a home
directory of their own, on loopback and free ports."""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
# The environment of the interpreter running the tests (a venv's root: bin/python, bin/mlflow), wherever
# it lives: the head's commands find it at ~/rerank-lab/.venv, as on a head (see head_home).
ENVIRONMENT = Path(sys.executable).parent.parent

# 617b804's head_setup_commands: the `pgrep -f` guard that never let MLflow start under Ray's wrapper
OLD_MLFLOW_COMMAND = (
    'cd ~/rerank-lab && (pgrep -f "mlflow server" || MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false nohup .venv/bin/mlflow server '
    "--host 127.0.0.1 --port 5000 --workers 1 --backend-store-uri sqlite:////mnt/shared/mlflow.db --artifacts-destination "
    "s3://REPLACE-rerank-lab-artifacts > ~/mlflow.log 2>&1 &)")


def as_ray_runs_it(command: str, home: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``command`` as Ray's SSHCommandRunner runs a head command: variables exported before it
    (Ray's `with_envs`, as for RAY_HEAD_IP), wrapped by Ray's `_with_interactive`, given to the
    login shell as sshd does."""
    from ray.autoscaler._private.command_runner import _with_interactive
    from ray.autoscaler._private.util import with_envs

    wrapped = " ".join(_with_interactive(with_envs([command], env or {})[0]))
    shell_env = {"HOME": str(home), "PATH": f"{home / 'rerank-lab' / '.venv' / 'bin'}:/usr/bin:/bin", "MLFLOW_DISABLE_TELEMETRY": "true",
                 "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True, env=shell_env, timeout=timeout)


@pytest.fixture()
def head_home(tmp_path):
    """A home like the head's: the project at ~/rerank-lab with its .venv (the tests' interpreter's
    environment: the checkout may have none), an empty ~/.bashrc."""
    home = tmp_path / "home"
    (home / "rerank-lab").mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in (".venv", "cluster"):
            (home / "rerank-lab" / entry.name).symlink_to(entry)
    # a copy, not a link: its scripts find the .venv at cluster/.., which the kernel resolves from the real directory
    shutil.copytree(REPO / "cluster", home / "rerank-lab" / "cluster")
    (home / "rerank-lab" / ".venv").symlink_to(ENVIRONMENT)
    (home / ".bashrc").write_text("")
    yield home
    # stop the supervisors this test started (each stops its command): those run from this home's
    # script, whatever their pid files say (a failed test may have left two)
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if f"{home}/rerank-lab/cluster/service.sh\0supervise".encode() in line:
            try:
                os.kill(int(entry.name), signal.SIGTERM)
            except ProcessLookupError:
                pass


def head_command(text: str) -> str:
    commands = yaml.safe_load((REPO / "cluster.yaml").read_text())["head_start_ray_commands"]
    found = [c for c in commands if text in c]
    assert len(found) == 1, f"cluster.yaml's head_start_ray_commands has no single command with {text!r}"
    return found[0]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def wait_for(predicate, timeout: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def processes_with(*needles: str) -> list[int]:
    """Pids whose command line holds every needle (read from /proc), supervisors (service.sh) aside."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if line and all(n in line for n in needles) and "service.sh" not in line:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_old_pgrep_guard_finds_its_own_wrapper_and_never_starts_mlflow(head_home):
    port = free_port()
    result = as_ray_runs_it(OLD_MLFLOW_COMMAND.replace("--port 5000", f"--port {port}"), head_home)
    # pgrep -f matched the wrapper's own command line (it holds "mlflow server"): a pid, exit 0, nothing launched
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() and all(p.isdigit() for p in result.stdout.split())
    assert not (head_home / "mlflow.log").exists()
    assert not answers(f"http://127.0.0.1:{port}/health")


def test_a_supervised_service_starts_once_restarts_and_stops_through_rays_wrapper(head_home, tmp_path):
    # cluster/service.sh with a small HTTP server in MLflow's place (the MLflow test below is slow)
    port = free_port()
    serve = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}"
    start = f"bash ~/rerank-lab/cluster/service.sh start web --ready-url http://127.0.0.1:{port}/ -- {serve}"
    first = as_ray_runs_it(start, head_home, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "web: started" in first.stdout and answers(f"http://127.0.0.1:{port}/")
    services = head_home / ".rerank-lab" / "services"
    supervisor = int((services / "web.pid").read_text())
    second = as_ray_runs_it(start, head_home, timeout=120)
    assert second.returncode == 0 and "web: already running" in second.stdout, second.stdout + second.stderr
    assert int((services / "web.pid").read_text()) == supervisor
    assert len(processes_with("http.server", str(port))) == 1
    # its command dies: the supervisor starts it again
    child = int((services / "web.child.pid").read_text())
    os.kill(child, signal.SIGKILL)
    restarted = lambda: (services / "web.child.pid").read_text().strip() not in ("", str(child)) and answers(f"http://127.0.0.1:{port}/")
    assert wait_for(restarted, 60)
    assert "exited with code 137; restarting" in (services / "web.log").read_text()
    status = as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh status web", head_home)
    assert status.returncode == 0 and "web: running" in status.stdout
    stop = as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh stop web", head_home)
    assert stop.returncode == 0 and "web: stopped" in stop.stdout
    assert wait_for(lambda: not processes_with("http.server", str(port)) and not alive(supervisor), 30)
    assert not (services / "web.pid").exists()


def test_a_pid_file_naming_another_process_does_not_count(head_home, tmp_path):
    # after a reboot the pid in a stale pid file may belong to anything: only this script supervising NAME counts
    services = head_home / ".rerank-lab" / "services"
    services.mkdir(parents=True)
    (services / "web.pid").write_text(str(os.getpid()))  # a live process, not the supervisor
    status = as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh status web", head_home)
    assert status.returncode == 1 and "web: not running" in status.stdout


def test_a_service_that_keeps_failing_is_given_up_and_says_so(head_home):
    env = {"SERVICE_MAX_RESTARTS": "1"}
    result = as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh start broken -- false", head_home, env)
    assert result.returncode == 0
    log = head_home / ".rerank-lab" / "services" / "broken.log"
    assert wait_for(lambda: "giving up" in log.read_text(), 30), log.read_text()
    assert as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh status broken", head_home).returncode == 1


def test_a_service_waits_for_the_shared_mount_and_gives_up_without_it(head_home, tmp_path):
    env = {"SERVICE_MOUNT_TIMEOUT": "1"}
    command = f"SERVICE_WAIT_FOR_MOUNT={tmp_path} bash ~/rerank-lab/cluster/service.sh start early -- true"
    assert as_ray_runs_it(command, head_home, env).returncode == 0
    log = head_home / ".rerank-lab" / "services" / "early.log"
    assert wait_for(lambda: log.exists() and "is not mounted" in log.read_text(), 30)
    assert ": starting:" not in log.read_text()  # the command never ran


@pytest.mark.slow  # starts an MLflow server (about 30 s here)
def test_cluster_yamls_mlflow_command_serves_once_and_stores_artifacts_in_s3(head_home, tmp_path):
    import boto3
    from moto.server import ThreadedMotoServer

    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0)  # S3 on loopback, as the server's boto3 sees it
    s3.start()
    port = free_port()
    try:
        host, s3_port = s3.get_host_and_port()
        endpoint = f"http://{host}:{s3_port}"
        credentials = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
        bucket = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        bucket.create_bucket(Bucket="rerank-lab-artifacts-test")
        command = head_command("service.sh start mlflow")
        assert "pgrep" not in command
        # the command as written, pointed at this machine: loopback port, a local run store, the bucket on loopback,
        # and "/" (always mounted) as the shared mount it waits for
        command = (command.replace("s3://REPLACE-rerank-lab-artifacts", "s3://rerank-lab-artifacts-test/mlflow")
                   .replace("127.0.0.1:5000", f"127.0.0.1:{port}")
                   .replace("SERVICE_WAIT_FOR_MOUNT=/mnt/shared", "SERVICE_WAIT_FOR_MOUNT=/"))
        env = {"MLFLOW_PORT": str(port), "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
               "MLFLOW_S3_ENDPOINT_URL": endpoint, **credentials}
        first = as_ray_runs_it(command, head_home, env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "mlflow: started" in first.stdout and f"answers at http://127.0.0.1:{port}/health" in first.stdout
        second = as_ray_runs_it(command, head_home, env)
        assert second.returncode == 0 and "mlflow: already running" in second.stdout, second.stdout + second.stderr
        servers = processes_with("mlflow", "server", "--backend-store-uri", str(tmp_path / "mlflow.db"))
        assert len(servers) == 1, servers
        # a client logs an artifact through the tracking server, which writes it to the bucket with its boto3
        import mlflow

        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        run = client.create_run(client.create_experiment("cluster-check"))
        (tmp_path / "note.txt").write_text("artifact")
        client.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
        keys = [o["Key"] for o in bucket.list_objects_v2(Bucket="rerank-lab-artifacts-test").get("Contents", [])]
        assert any(k.startswith("mlflow/") and k.endswith("/artifacts/note.txt") for k in keys), keys
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["note.txt"]
        assert as_ray_runs_it("bash ~/rerank-lab/cluster/service.sh stop mlflow", head_home).returncode == 0
        assert wait_for(lambda: not processes_with("mlflow", "server", str(tmp_path / "mlflow.db")), 60)
    finally:
        s3.stop()


def test_mlflow_server_refuses_s3_without_boto3_in_one_line(tmp_path):
    # the server's S3 artifact store needs boto3: a venv without it is one line, not an HTTP 500 at the first artifact
    fake = tmp_path / "venv" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").symlink_to("/usr/bin/python3")  # the system's Python: no boto3 (checked below)
    (fake / "mlflow").write_text("#!/bin/sh\nexit 0\n")
    (fake / "mlflow").chmod(0o755)
    if subprocess.run([str(fake / "python"), "-c", "import boto3"], capture_output=True).returncode == 0:
        pytest.skip("this machine's system Python has boto3")
    env = dict(os.environ, MLFLOW_BIN=str(fake / "mlflow"), MLFLOW_ARTIFACTS_DESTINATION="s3://bucket/x")
    result = subprocess.run(["bash", str(REPO / "cluster" / "mlflow-server.sh")], capture_output=True, text=True, env=env)
    assert result.returncode == 3 and "boto3 is not installed" in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_head_starts_its_services_after_ray_and_the_mount(head_home):
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    commands = config["head_start_ray_commands"]
    ray_start = next(i for i, c in enumerate(commands) if "ray start --head" in c)
    for name in ("service.sh start mlflow", "service.sh start worker-guard"):
        command = head_command(name)
        assert commands.index(command) > ray_start and "SERVICE_WAIT_FOR_MOUNT=/mnt/shared" in command
        assert shlex.split(command)  # one shell command
    assert not any("pgrep" in c for key in ("head_setup_commands", "head_start_ray_commands", "setup_commands")
                   for c in config[key])
