"""Run a trial's training as Ray Train workers and its test evaluation as a Ray task.

Train V2 pattern: a ``TorchTrainer`` with a ``ScalingConfig`` (1..n workers,
GPU when the cluster has one), checkpoints persisted under the run's storage path, one
checkpoint per epoch scored by validation nDCG@10.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml

from orchestrator.core import ray_output
from orchestrator.core.ray_address import describe_joined, free_port, ray_address_to_join
from orchestrator.core.schema import OBJECTIVE
from workloads.core.errors import InputError
from workloads.core.logs import LEVEL_ENV, get_logger
from workloads.core.logs import configure as configure_logging
from workloads.core.paths import CACHE_DIR_ENV, DATA_DIR_ENV, cache_dir, data_dir
from workloads.kinds import TRIAL_KINDS, kind_of

logger = get_logger("run")  # the project's name: shown at the CLI's levels, as [run]

# Defaults for the driver and every Ray worker (an exported value wins): quiet and prompt.
# Downloads stay on (Hugging Face's and ir_datasets' own behaviour): a fresh cluster node must
# fetch its model; offline is what the user, the Makefile and the tests set (HF_HUB_OFFLINE=1).
ENV_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    # Train V2 patches print() in workers to tee it into its logger, whose console handler
    # prints it again: every progress line reached the driver twice.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # Train V2's controller polls its worker group every 2 s, and a finished trial waits on
    # those polls: an empty TorchTrainer.fit took 14.7 s here, 5 s of it after the loop had
    # returned; polling every 0.25 s (a status call per worker) cut that to 1 s
    # (benchmarks/trial_overhead.py, README "Performance"). Export the variable to override.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
}
# Passed on to every Ray worker when set (the defaults above are always passed): offline mode
# and where downloads and the cache live, so workers on other nodes do what the driver does;
# the spot notice's endpoint and interval (workloads.training.spot); where Ray's State API is
# served, when the user names it for a cluster of theirs.
API_SERVER_ENV = "RAY_API_SERVER_ADDRESS"
PASSED_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_ENDPOINT", "IR_DATASETS_HOME", "ANSERINI_INDEX_CACHE",
              "ORCHESTRATE_INSTANCE_METADATA", "ORCHESTRATE_SPOT_POLL_SECONDS", API_SERVER_ENV)
# Variables a test sets to make chosen sweep cells fail (or a write meet a full disk) on purpose (read in one place,
# orchestrator.sweep.tune); passed to Ray workers when set, never set in production.
TEST_HOOK_ENV = ("ORCHESTRATE_TEST_FAIL_CELLS", "ORCHESTRATE_TEST_ENOSPC_AT")
# A test switch (tests/sweep/test_cluster_guide.py): a trial placed on a GPU a test node only
# declares trains on this device, torch.distributed on gloo; read on the driver, never set in production.
FAKE_GPU_DEVICE_ENV = "ORCHESTRATE_FAKE_GPU_DEVICE"


# Ray's token authentication switch (ray/_private/authentication/authentication_token_setup.py).
AUTH_MODE_ENV = "RAY_AUTH_MODE"


def set_environment_defaults() -> None:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)


def pin_storage_paths() -> None:
    """Make the data and cache directories absolute environment values before workers start.

    Ray Tune runs each trial in a working directory of its own, so a default or relative
    path would resolve per trial: every trial would rebuild the index, the BM25 runs and the
    training sets in its own empty cache instead of reusing the driver's.
    """
    os.environ[CACHE_DIR_ENV] = str(cache_dir())
    if data_dir() is not None:
        os.environ[DATA_DIR_ENV] = str(data_dir())


def worker_env() -> dict[str, str]:
    """The driver's variables every Ray worker gets (Ray's runtime_env): the defaults, offline
    mode and download locations when set, the data and cache directories, the log level."""
    return {k: os.environ[k] for k in (*ENV_DEFAULTS, *PASSED_ENV, DATA_DIR_ENV, CACHE_DIR_ENV, LEVEL_ENV, *TEST_HOOK_ENV)
            if k in os.environ}


# Ray's own words when the node a private Ray starts does not register within 30 s (a bare
# Exception, ray/_private/node.py; a driver joining a cluster does not wait so). Seen on a 2-core
# machine with a second Ray starting beside it (docs/performance.md, "Faults and recovery").
RAY_START_TIMED_OUT = "timed out during startup"


def ray_start_timed_out(message: str) -> str:
    """The one line for a private Ray that did not start in time: Ray's words, how loaded this
    machine is, and what to do: a busy machine (the usual cause) asks for the command again
    (nothing was started before it); an idle one for Ray's own logs (a raylet that failed)."""
    cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # (no load average on this platform)
        load = None
    from ray._common.utils import get_default_ray_temp_dir  # (Ray's own: $RAY_TMPDIR, $TMPDIR, /tmp)

    logs = Path(get_default_ray_temp_dir()) / "session_latest" / "logs"
    advice = ("run the same command again when the machine is less busy (what finished before is kept and reused)"
              if load is not None and load >= cpus else f"see why in Ray's logs ({logs}: raylet.err, gcs_server.err)")
    where = f"load average {load:.1f} on {cpus} CPUs" if load is not None else f"{cpus} CPUs"
    return f"a private Ray on this machine did not start in time ({message.rstrip('.')}; {where}): {advice}"


# The cluster init_ray joined (None: a private Ray it started): what check_resources' advice fits.
joined_cluster: str | None = None


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster ``address`` names ($RAY_ADDRESS, else the one running on this
    machine), else start a private Ray on this machine (``local``: always a private one)."""
    import ray

    ray_output.attach()  # inside `run`: Ray's own output from here on to run.log (before ray.init's own lines)
    if ray.is_initialized():
        return
    set_environment_defaults()
    pin_storage_paths()
    env_vars = worker_env()
    address = ray_address_to_join(address)
    kwargs = {"address": address} if address else {"address": "local", "num_cpus": num_cpus}
    port = None
    if not address:
        # No token auth for a private Ray (as before Ray 2.59): with RAY_AUTH_MODE unset Ray 2.60's
        # ray.init turns it on and writes ~/.ray/auth_token (ray/_private/worker.py), which a later
        # `ray start --head` here obeys and its workers do not (ray/scripts/scripts.py). An exported
        # mode wins; a joined cluster's driver follows the cluster's token.
        os.environ.setdefault(AUTH_MODE_ENV, "disabled")
        # The dashboard serves the State API whereby every trial's PlacementGroupCleaner asks
        # whether its controller lives. Unaddressed, the State API looks for the cluster in
        # ray_current_cluster, which beside a private Ray (--address local) names another one:
        # it waited on that and every Train V2 fit ended 12 s late (the cleaner's stop timeout;
        # benchmarks/trial_overhead.py). Pin this Ray's dashboard port and point workers at it.
        port = free_port()
        kwargs |= {"dashboard_host": "127.0.0.1", "dashboard_port": port}
        env_vars[API_SERVER_ENV] = f"http://127.0.0.1:{port}"
    try:
        context = ray.init(runtime_env={"env_vars": env_vars}, log_to_driver=True, **kwargs)
    except Exception as exc:
        message = " ".join(str(exc).split())
        if isinstance(exc, RuntimeError) and "Version mismatch" in message:  # Ray's check: the cluster's Python or Ray
            raise InputError(address or "ray", f"{message}: run orchestrate from the cluster's Python "
                                               "(cluster/python-version) and Ray") from None
        if not address and RAY_START_TIMED_OUT in message:
            raise InputError("ray", ray_start_timed_out(message)) from None
        raise
    global joined_cluster
    joined_cluster = address
    if address:
        get_logger("ray").info("%s", describe_joined(address))  # the project's log: said at the default level
    ray_output.attach()
    if port is not None and not str(context.dashboard_url or "").endswith(f":{port}"):
        logger.warning("Ray's dashboard did not start on port %d (%s): Ray Train may wait on a stale "
                       "cluster address at the end of each trial", port, context.dashboard_url or "not started")


def check_resources(spec) -> None:
    """A trial whose worker asks more than any node of the cluster has (``cpus_per_worker`` CPUs,
    a GPU with ``use_gpu: true``) would wait forever (Ray Train retries its worker start-up):
    one line instead. A cluster that scales up is judged by its largest node type (the
    autoscaler's configuration, :func:`largest_node`)."""
    largest = largest_node()
    if limits_unreadable() is not None:
        # GPU workers scaling from 0 leave the live cluster without a GPU: "no GPU" would be a
        # guess; the sweep says in one line that the limits could not be read instead
        return
    cpus, gpus = largest.get("CPU", 0), largest.get("GPU", 0)
    needed_gpu = spec.resources.use_gpu is True
    where = "the cluster's largest node" + (" type" if largest.get("_from_autoscaler") else "")
    if spec.resources.cpus_per_worker > cpus:
        raise InputError(f"{spec.name}: resources.cpus_per_worker {spec.resources.cpus_per_worker:g}",
                         f"{where} has {cpus:g} CPUs: a worker could never start (lower cpus_per_worker)")
    if needed_gpu and gpus < 1:
        # On a cluster the grid is meant for its GPU workers: "use_gpu: auto" would run it on the
        # head's CPUs. On a private Ray (a laptop) running on the CPU is a choice to offer.
        advice = ("check the cluster's GPU worker types (`ray status` lists its nodes and their resources)"
                  if joined_cluster else "use_gpu: auto uses one where there is one")
        raise InputError(f"{spec.name}: resources.use_gpu true", f"{where} has no GPU: a worker could never start ({advice})")


def largest_node() -> dict:
    """The resources of the largest node a worker could land on: the live nodes', or, where Ray's
    autoscaler can start more, its node types' (``available_node_types`` of the cluster file)."""
    import ray

    best: dict = {}
    for node in ray.nodes():
        if node.get("Alive"):
            resources = node.get("Resources", {})
            if resources.get("CPU", 0) + 1000 * resources.get("GPU", 0) > best.get("CPU", 0) + 1000 * best.get("GPU", 0):
                best = dict(resources)
    for resources in autoscaler_node_types().values():
        if resources.get("CPU", 0) + 1000 * resources.get("GPU", 0) > best.get("CPU", 0) + 1000 * best.get("GPU", 0):
            best = {**resources, "_from_autoscaler": True}
    return best


def autoscaler_node_types() -> dict[str, dict]:
    """Node type -> resources of the nodes the cluster's autoscaler can start, from the
    autoscaling configuration the head serves (empty without an autoscaler: a local Ray)."""
    return {name: dict(config.get("resources", {})) for name, config in _autoscaling_config().get("available_node_types", {}).items()}


def _autoscaling_config() -> dict:
    """The node types the cluster's autoscaler can start and its limits, in the cluster file's
    shape (``available_node_types`` with ``resources`` and ``max_workers``, ``max_workers``,
    ``head_node_type``); empty without an autoscaler (a local Ray, a fixed ``ray start`` cluster).

    Ray serves no public API for this. Autoscaler v2 reports its node groups to the GCS (read
    as Ray Data's autoscaler reads them); autoscaler v1, the default of ``ray up`` and of
    ``ray start --autoscaling-config``, only holds its cluster file, which the driver reads from
    the command line of the autoscaler's process (the monitor) when it runs on the head, as
    ``cluster.yaml`` and ``cluster-local.yaml`` tell you to run sweeps.

    Where neither can be read (a Ray Client driver, a driver off the head, KubeRay's autoscaler
    in its own container, an internal API that moved) the answer is ``{UNREADABLE: why}``: not
    knowing the limits is not the same as having none, and callers must not judge by the live
    nodes then (GPU workers scaling from 0 are not live before the first trial asks)."""
    try:
        if _ray_client():
            return {UNREADABLE: "a Ray Client driver (ray://) sees neither the head's processes nor the autoscaler's state"}
        return _reported_node_groups() or _monitor_cluster_file()
    except Exception as exc:  # internal APIs that moved
        return {UNREADABLE: f"reading them failed: {exc}"}


# The key of _autoscaling_config()'s answer when the autoscaler's limits could not be read: why.
UNREADABLE = "_unreadable"


def limits_unreadable() -> str | None:
    """Why the autoscaler's limits could not be read, or None when they were (or there is no
    autoscaler: a local Ray, a fixed cluster)."""
    return _autoscaling_config().get(UNREADABLE)


def _ray_client() -> bool:
    import ray

    return ray.util.client.ray.is_connected()


def _reported_node_groups() -> dict:
    import ray

    config = ray._private.state.state.get_cluster_config()
    if config is None or not config.node_group_configs:
        return {}
    return {"available_node_types": {group.name: {"resources": dict(group.resources),
                                                  "max_workers": group.max_count if group.max_count >= 0 else UNLIMITED_NODES}
                                     for group in config.node_group_configs},
            "max_resources": dict(config.max_resources)}


# A node group without a limit of its own (autoscaler v2's max_count -1) counts as this many
# nodes: a sweep then keeps that many trials per group in flight, not every trial it has.
UNLIMITED_NODES = 64


def _monitor_cluster_file() -> dict:
    # isort: off
    import ray  # first: psutil is Ray's vendored copy (ray/thirdparty_files, on the path once ray is imported)
    import psutil
    # isort: on

    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        # autoscaler v1's entry point, or v2's (ray start with RAY_enable_autoscaler_v2=1)
        if not any(part.endswith(("autoscaler/_private/monitor.py", "autoscaler/v2/monitor.py")) for part in command):
            continue
        if not any(part.startswith("--gcs-address=") and part.endswith(f":{port}") for part in command):
            continue
        for part in command:
            if part.startswith("--autoscaling-config="):
                path = Path(part.split("=", 1)[1]).expanduser()
                path = path if path.is_absolute() else Path(process.cwd()) / path
                return yaml.safe_load(path.read_text()) or {}
        return {}  # the head's monitor without a cluster file: no autoscaler (a local Ray, a fixed cluster)
    # Every head started by `ray start --head` or ray.init runs a monitor; none here for this
    # cluster: the driver is not on the head, or the autoscaler runs elsewhere (KubeRay starts
    # the head with --no-monitor and its autoscaler in a container of its own).
    return {UNREADABLE: "no autoscaler process of this cluster on this machine (the driver is not on the head, or the "
                        "autoscaler runs in a container of its own, as KubeRay's does)"}


def _fits(node: dict, worker: dict) -> int:
    """How many workers asking ``worker`` one node with ``node`` holds."""
    return int(min(node.get(name, 0) // amount for name, amount in worker.items() if amount > 0))


@dataclass(frozen=True)
class Capacity:
    trials: int  # trials of one shape the cluster runs at once at its largest
    source: str  # where that number comes from, said in the sweep's log
    unreadable: str | None = None  # why the autoscaler's limits could not be read: ``trials`` counts the live nodes only


def trial_capacity(spec) -> Capacity:
    """How many trials shaped like ``spec`` (``workers`` workers of ``cpus_per_worker`` CPUs and a
    GPU each where the trial uses one) run at once on the cluster at its largest.

    With an autoscaler, its limits: the live head, plus each worker node type at its
    ``max_workers`` (the cluster's own ``max_workers`` caps the nodes, the roomiest types
    first). A sweep keeps that many trials in flight, so their pending workers are the demand
    that makes the autoscaler start nodes; finished cells leave nodes idle and it removes
    them. Without an autoscaler, the live nodes (a worker must fit on one node). Where the
    limits could not be read, the live nodes too, with ``unreadable`` saying why: a number no
    sweep runs on (:func:`orchestrator.sweep.tune._max_concurrent`)."""
    import ray

    worker = {"CPU": spec.resources.cpus_per_worker, **({"GPU": 1} if _use_gpu(spec) else {})}
    config = _autoscaling_config()
    head_type = config.get("head_node_type")
    node_types = {name: c for name, c in config.get("available_node_types", {}).items() if name != head_type}
    if node_types:
        head = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" in n.get("Resources", {})]
        slots = sum(_fits(resources, worker) for resources in head)
        # a node type without max_workers may start up to the cluster's (Ray's own default)
        room = config.get("max_workers", sum(c.get("max_workers", UNLIMITED_NODES) for c in node_types.values()))
        described = []
        for name, node in sorted(node_types.items(), key=lambda kv: -_fits(kv[1].get("resources", {}), worker)):
            count = min(node.get("max_workers", room), room)
            fit = _fits(node.get("resources", {}), worker)
            if count and fit:
                slots += count * fit
                room -= count
                described.append(f"{count} x {name}")
        if config.get("max_resources"):  # autoscaler v2's cluster-wide caps (CPU, GPU, ...)
            slots = min(slots, _fits({**dict.fromkeys(worker, 1e9), **config["max_resources"]}, worker))  # uncapped: any
        source = "the autoscaler's limits: " + (", ".join(described) or "no node type fits a worker")
    else:
        slots = sum(_fits(n.get("Resources", {}), worker) for n in ray.nodes() if n.get("Alive"))
        source = "the live cluster's nodes"
    return Capacity(max(1, slots // spec.resources.workers), source, config.get(UNREADABLE))


def cluster_has_gpu() -> bool:
    """A live GPU, or one the autoscaler can start: GPU workers that scale from 0 have none yet
    when the first trial is made, and its trainer must still ask for one."""
    import ray

    if ray.cluster_resources().get("GPU", 0) > 0:
        return True
    return any(node.get("resources", {}).get("GPU", 0) > 0 and node.get("max_workers", 1) > 0
               for node in _autoscaling_config().get("available_node_types", {}).values())


def _gpu_device() -> str:
    return os.environ.get(FAKE_GPU_DEVICE_ENV) or "cuda"


def _use_gpu(spec) -> bool:
    return cluster_has_gpu() if spec.resources.use_gpu == "auto" else bool(spec.resources.use_gpu)


@dataclass(frozen=True)
class EpochResult:
    metrics: dict[str, float]
    checkpoint: str


def _train_loop_per_worker(config: dict) -> None:
    # Runs in every Ray Train worker; torch.distributed is already set up by TorchTrainer.
    import ray.train
    import ray.train.torch

    # Ray Train's start-up: the controller, the worker group, torch.distributed and the imports
    # (wall clock: the trainer was made in another process; this attempt's first report carries it)
    startup = {"epoch_startup_seconds": max(0.0, time.time() - config["submitted_at"])} if "submitted_at" in config else {}
    configure_logging()  # the driver's level, from the environment
    kind = TRIAL_KINDS[config["kind"]]
    spec = kind.spec.model_validate(config["spec"])
    inputs = kind.inputs(**config["inputs"])
    in_epoch = {"in_epoch_dir": Path(config["in_epoch_dir"])} if kind.resumes_in_epoch and "in_epoch_dir" in config else {}

    def report(metrics: dict[str, float], checkpoint_dir: Path | None) -> None:
        if startup:
            metrics = {**metrics, **startup}
            startup.clear()
        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        # persisted (copied) under the run's storage before report returns; the loop then removes the directory
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(checkpoint_dir)),
                         checkpoint_dir_name=f"epoch-{int(metrics['epoch'])}")

    # a sweep's pruner asks a trial to stop by creating this file (see orchestrator.sweep.search)
    stop = {"stop_requested": Path(config["stop_file"]).exists} if config.get("stop_file") else {}
    restored = ray.train.get_checkpoint()
    if restored is not None:
        startup.clear()  # a restarted worker group: the time since submission includes the failed attempt
    device = torch.device(config["device"]) if "device" in config else ray.train.torch.get_device()
    if restored is None:
        kind.train(spec, inputs, report, device=device, **stop, **in_epoch)
    else:
        with restored.as_directory() as resume_from:
            kind.train(spec, inputs, report, device=device, resume_from=Path(resume_from), **stop, **in_epoch)


def input_error_in(exc: BaseException) -> InputError | None:
    """The :class:`InputError` a Ray worker raised, under Ray's wrappers: a task's
    ``RayTaskError`` (``cause``), Train V2's ``ControllerError`` (``controller_failure``) and
    ``WorkerGroupError`` (``worker_failures``, each maybe a ``UserExceptionWithTraceback``),
    and explicit chaining (``raise ... from``). Not ``__context__``: an error raised while one
    was handled is another error, a bug to show whole."""
    seen, pending = set(), [exc]
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        cause = getattr(error, "cause", None)  # RayTaskError: the worker's own error (itself an instance of its class)
        if isinstance(error, InputError) and not isinstance(cause, BaseException):
            return error
        pending += [error.__cause__, cause, getattr(error, "controller_failure", None), getattr(error, "_base_exc", None)]
        pending += list((getattr(error, "worker_failures", None) or {}).values())
    return None


def input_error_ends_training():
    """A Ray Train callback (run on Train's controller) by which a worker's :class:`InputError`
    ends the training at once: bad input fails every attempt alike, and Train V2 retries any
    worker's error (``FailureConfig.max_failures``: 4 attempts of one failure by default). Train
    has no per-error retry rule; an error a callback raises is the controller's, which Train
    never retries (``ControllerError``), and the driver finds the InputError under it."""
    from ray.train import UserCallback

    class InputErrorEndsTraining(UserCallback):  # (defined here: Ray is imported where it is used)
        def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
            for error in worker_exceptions.values():
                found = input_error_in(error)
                if found is not None:
                    raise found

    return InputErrorEndsTraining()


def make_trainer(spec, inputs, storage_path: Path, run_name: str, callbacks: list | None = None,
                 stop_file: Path | None = None):
    """The ``TorchTrainer`` of a trial of any kind (``workloads.kinds``): ``workers``
    data-parallel workers, a checkpoint per epoch. With ``stop_file`` the training loop ends
    by itself, releasing its workers, once that file exists (a sweep's pruning decision)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    use_gpu = _use_gpu(spec)
    fake = {"device": _gpu_device()} if use_gpu and _gpu_device() != "cuda" else {}
    resources = {"CPU": spec.resources.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    return TorchTrainer(
        _train_loop_per_worker,
        train_loop_config={"kind": kind_of(spec).name, "spec": spec.model_dump(mode="json"), "inputs": asdict(inputs),
                           "submitted_at": time.time(), "in_epoch_dir": str(in_epoch_dir(storage_path, run_name)),
                           **({"stop_file": str(stop_file)} if stop_file is not None else {}), **fake},
        torch_config=TorchConfig(backend="gloo") if fake else None,
        scaling_config=ScalingConfig(num_workers=spec.resources.workers, use_gpu=use_gpu, resources_per_worker=resources),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(Path(storage_path).resolve()),
            checkpoint_config=CheckpointConfig(checkpoint_score_attribute=OBJECTIVE, checkpoint_score_order="max"),
            failure_config=FailureConfig(max_failures=spec.resources.max_failures),
            callbacks=[input_error_ends_training(), *(callbacks or [])],
        ),
    )


IN_EPOCH_DIR = "in-epoch-checkpoint"


def in_epoch_dir(storage_path: Path, run_name: str) -> Path:
    """Where a Train run keeps its state inside an epoch (``optimization.checkpoint_every``):
    beside Ray Train's epoch checkpoints, on the storage every node sees, under a name that a
    restarted attempt of the same run finds again."""
    return Path(storage_path).resolve() / run_name / IN_EPOCH_DIR


def epoch_results(result) -> list[EpochResult]:
    epochs = [EpochResult(dict(metrics), checkpoint.path) for checkpoint, metrics in result.best_checkpoints]
    return sorted(epochs, key=lambda e: e.metrics["epoch"])


def train_on_ray(spec, inputs, storage_path: Path, run_name: str) -> list[EpochResult]:
    """Fit the trial with Ray Train; returns every epoch's metrics and persisted checkpoint.

    Ctrl-C raises :class:`KeyboardInterrupt` here once the run's workers are stopped. In a main
    thread Ray Train's ``fit()`` installs a SIGINT handler that exits the process (status 1, no
    word, the trial's MLflow run left open) and is never removed; its one hook for that,
    ``_register_sigint_handler``, is given our list instead, which keeps the controller to abort."""
    import ray

    trainer = make_trainer(spec, inputs, storage_path, run_name)
    controllers: list = []
    if hasattr(trainer, "_register_sigint_handler"):
        trainer._register_sigint_handler = controllers.append
    try:
        return epoch_results(trainer.fit())
    except KeyboardInterrupt:
        for controller in controllers:  # stop the workers now; the run resumes from its last checkpoint
            with contextlib.suppress(Exception):
                ray.get(controller.abort.remote(), timeout=30)
        raise


def submit_task(spec, function, *args, **kwargs):
    """``function(*args, device=..., **kwargs)`` as a Ray task with the trial's resources (a GPU
    when the cluster has one and the spec allows it); returns its ObjectRef."""
    import ray

    use_gpu = _use_gpu(spec)
    device = _gpu_device() if use_gpu else "cpu"

    @ray.remote(num_cpus=spec.resources.cpus_per_worker, num_gpus=1 if use_gpu else 0, max_retries=1)
    def task():
        configure_logging()
        return function(*args, device=torch.device(device), **kwargs)

    return task.remote()
