"""How a failed trial is classified: a step that does not fit is recorded as ``failure=oom`` and
not retried; a worker that Ray's memory monitor killed is an accident of its node (other
processes' memory counts too) and raises, so Tune retries it. Ray's own exception types and
the raylet's message, without a cluster."""

import pytest
from ray.exceptions import OutOfMemoryError
from ray.train import WorkerGroupError

from orchestrator.sweep.tune import _is_out_of_memory
from workloads.training import StepOutOfMemoryError

# The raylet's words when its memory monitor kills a worker (Ray 2.60's format strings, filled in)
MONITOR_KILL = ("1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.3.7, ID: "
                "5f1c0e6a9b) was 60.12GB used / 62.00GB limit (0.969674). Refer to the documentation on how to address "
                "the out of memory issue: ... To adjust the kill threshold, set the environment variable "
                "`RAY_memory_usage_threshold` when starting Ray.")


def _worker_group_error(failure: BaseException) -> WorkerGroupError:
    """What ``TorchTrainer.fit()`` raises when a worker fails: the failures by rank, and their text."""
    return WorkerGroupError(f"[Rank 0]\n{type(failure).__module__}.{type(failure).__name__}: {failure}", {0: failure})


@pytest.mark.parametrize("failure", [
    OutOfMemoryError(MONITOR_KILL),
    _worker_group_error(OutOfMemoryError(MONITOR_KILL)),
    # the actor's death, as Ray Train reports it: the monitor's message inside another error type
    _worker_group_error(RuntimeError("The actor died unexpectedly before finishing this task.\n\tclass_name: "
                                     "RayTrainWorker\n" + MONITOR_KILL)),
], ids=["the-exception", "inside-ray-train", "an-actor-death"])
def test_a_memory_monitor_kill_is_retried_not_recorded_as_out_of_memory(failure):
    assert not _is_out_of_memory(failure)


@pytest.mark.parametrize("failure", [
    StepOutOfMemoryError("a step of 128 sequences of up to 512 tokens does not fit on cuda:0: lower "
                         "optimization.batch_size"),
    _worker_group_error(StepOutOfMemoryError("a step of 128 sequences does not fit on cuda:0")),
    _worker_group_error(RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")),
], ids=["the-step", "inside-ray-train", "cuda"])
def test_a_step_that_does_not_fit_is_a_deterministic_out_of_memory(failure):
    assert _is_out_of_memory(failure)


def test_other_failures_are_neither():
    assert not _is_out_of_memory(_worker_group_error(ValueError("training rows make no full step")))
