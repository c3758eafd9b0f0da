"""Bad input raised inside a Ray worker (a task, a Train worker, a Tune trial) reaches the terminal
as one line with exit 2, and is not retried: every project error survives pickling (Ray sends a
worker's error to the driver pickled) and the driver finds it under Ray's wrappers."""

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.core.config import DuplicateKey
from orchestrator.core.execution import init_ray, input_error_ends_training, input_error_in, submit_task
from orchestrator.core.interrupts import Interrupted
from tests.helpers import run_cli
from workloads.core.errors import InputError, RequirementNotTrained
from workloads.kinds.protocol import GridError
from workloads.training.step import StepOutOfMemoryError

ERRORS = [InputError("trial.yaml:3", "model.name: no such model"),
          RequirementNotTrained("selector.yaml", "not trained yet"),
          GridError("two entries collapse", [("loss", 0), ("loss", 2)]),
          DuplicateKey("model", 7, 3),
          Interrupted("sweep x interrupted: 2 runs kept"),
          StepOutOfMemoryError("lower batch_size")]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_project_error_survives_pickling(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_the_input_error_is_found_under_rays_wrappers():
    from ray.exceptions import RayTaskError
    from ray.train import ControllerError, WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    bad = InputError("gen.yaml", "generator not cached: run `orchestrate prepare` first")
    task = RayTaskError("f", "Traceback ...\nInputError", bad).as_instanceof_cause()
    assert input_error_in(task) is bad  # not the RayTaskError, whose text is the worker's traceback
    assert input_error_in(ControllerError(bad)) is bad
    workers = WorkerGroupError("failed", {0: RuntimeError("collective aborted"), 1: UserExceptionWithTraceback(bad, "tb")})
    assert input_error_in(workers) is bad
    try:
        raise RuntimeError("wrapped") from bad
    except RuntimeError as chained:
        assert input_error_in(chained) is bad
    try:  # a bug raised while an InputError was handled is a bug, shown whole
        try:
            raise bad
        except InputError:
            raise KeyError("bug") from None
    except KeyError as bug:
        assert input_error_in(bug) is None


def _command_raising(monkeypatch, error: BaseException):
    def command(args):
        raise error
    monkeypatch.setattr("orchestrator.cli.status.run", command)


def test_a_train_failure_caused_by_bad_input_is_one_line_and_exit_2(monkeypatch):
    from ray.train import ControllerError

    _command_raising(monkeypatch, ControllerError(InputError("gen.yaml", "generator not cached")))
    result = run_cli(None, "status", "x.yaml")
    assert result.returncode == 2
    assert result.stderr == "error: gen.yaml: generator not cached\n"


def test_a_train_failure_of_another_cause_is_not_reported_as_bad_input(monkeypatch):
    from ray.train import ControllerError

    _command_raising(monkeypatch, ControllerError(RuntimeError("a bug")))
    result = run_cli(None, "status", "x.yaml")
    assert result.returncode == 1 and "Traceback" in result.stderr


def _project_lines(stderr: str) -> list[str]:
    """The driver's own lines: not those Ray forwards from its workers ("(RayTrainWorker pid=...)")."""
    return [line for line in stderr.splitlines() if "pid=" not in line and line.strip()]


@pytest.mark.slow
def test_an_input_error_in_a_ray_task_is_one_line_and_exit_2(monkeypatch):
    def raises(device):
        raise InputError("dense.yaml", "first_stage.generator: not cached")

    def command(args):
        import ray

        init_ray()
        spec = SimpleNamespace(resources=SimpleNamespace(cpus_per_worker=1, use_gpu=False))
        ray.get(submit_task(spec, raises))

    monkeypatch.setattr("orchestrator.cli.status.run", command)
    result = run_cli(None, "status", "x.yaml")
    assert result.returncode == 2, result.stderr[-3000:]
    assert _project_lines(result.stderr)[-1:] == ["error: dense.yaml: first_stage.generator: not cached"]
    assert "Traceback" not in "\n".join(_project_lines(result.stderr))


@pytest.mark.slow
def test_an_input_error_in_a_train_worker_is_one_line_exit_2_and_not_retried(monkeypatch, tmp_path):
    attempts = tmp_path / "attempts.log"

    def loop(config):  # (a local function: sent to the worker by value)
        with open(config["attempts"], "a") as log:
            log.write("attempt\n")
        raise InputError("dense.yaml", "first_stage.generator: not cached")

    def command(args):
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        init_ray()
        TorchTrainer(loop, train_loop_config={"attempts": str(attempts)}, scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name="bad-input", storage_path=str(tmp_path / "ray"),
                                          failure_config=FailureConfig(max_failures=3),  # the trials' default
                                          callbacks=[input_error_ends_training()])).fit()

    monkeypatch.setattr("orchestrator.cli.status.run", command)
    result = run_cli(None, "status", "x.yaml")
    assert result.returncode == 2, result.stderr[-3000:]
    assert _project_lines(result.stderr)[-1:] == ["error: dense.yaml: first_stage.generator: not cached"]
    assert "Traceback" not in "\n".join(_project_lines(result.stderr))
    assert Path(attempts).read_text().count("attempt") == 1  # not retried: Train's default would try 4 times
