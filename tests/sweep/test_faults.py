"""How a failed trial is classified: a step that does not fit is recorded as ``failure=oom`` and
not retried; a worker that Ray's memory monitor killed is an accident of its node (other
processes' memory counts too) and raises, so Tune retries it. Ray's own exception types and
the raylet's message, without a cluster."""

from types import SimpleNamespace

import pytest
from ray.exceptions import OutOfMemoryError
from ray.train import WorkerGroupError

from orchestrator.sweep.search import FAILURE, INPUT_ERROR_PROBLEM, INPUT_ERROR_SOURCE, INPUT_FAILURE
from orchestrator.sweep.tune import MlflowTrialLogger, _InterruptStopper, _is_out_of_memory
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


class _RecordingTracker:
    """The tracker calls of the Tune callback, as the runs' status and tags they leave."""

    def __init__(self, runs: list[str]):
        self.status = dict.fromkeys(runs, "RUNNING")
        self.tags: dict[str, dict] = {run: {} for run in runs}
        self.client = SimpleNamespace(get_run=lambda run: SimpleNamespace(info=SimpleNamespace(status=self.status[run])))

    def set_tags(self, run, tags):
        self.tags[run].update(tags)

    def finish(self, run, status="FINISHED"):
        self.status[run] = status

    def fail(self, run, failure, error=None):
        self.set_tags(run, {"failure": failure, "error": str(error)})
        self.finish(run, "FAILED")


def test_bad_input_fails_its_trial_run_at_once_and_the_trials_it_stopped_are_resumable():
    """The stopper ends the Tune run on the result that reports bad input, before Tune says the trial
    completed: its run is FAILED then, and the runs of the trials stopped with it are KILLED and
    marked interrupted (their Optuna trials stay RUNNING: the next run resumes them), none RUNNING."""
    tracker = _RecordingTracker(["bad", "other"])
    logger = MlflowTrialLogger(tracker, "1", {}, None, None, None)
    logger.runs = {"t-bad": "bad", "t-other": "other"}
    logger.on_trial_result(0, [], SimpleNamespace(trial_id="t-bad"),
                           {FAILURE: INPUT_FAILURE, INPUT_ERROR_SOURCE: "m", INPUT_ERROR_PROBLEM: "cannot load model"})
    assert (str(logger.input_error), tracker.status["bad"]) == ("m: cannot load model", "FAILED")
    assert tracker.tags["bad"] == {"failure": "input", "error": "m: cannot load model"}
    assert _InterruptStopper(SimpleNamespace(is_set=lambda: False), logger).stop_all()
    logger.close_stopped()
    assert tracker.status == {"bad": "FAILED", "other": "KILLED"}
    assert tracker.tags["other"] == {"rerank_lab.interrupted": "true"}
