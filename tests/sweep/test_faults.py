"""How a failed trial is classified: a step that does not fit is recorded as ``failure=oom`` and
not retried; a worker that Ray's memory monitor killed is an accident of its node (other
processes' memory counts too) and raises, so Tune retries it. Ray's own exception types and
the raylet's message, without a cluster."""

import json
from types import SimpleNamespace

import pytest
from ray.exceptions import OutOfMemoryError
from ray.train import WorkerGroupError

from orchestrator.core.tracking import Tracker
from orchestrator.sweep.search import FAILURE, INPUT_ERROR_PROBLEM, INPUT_ERROR_SOURCE, INPUT_FAILURE
from orchestrator.sweep.tune import EPOCH_HISTORY, MlflowTrialLogger, _InterruptStopper, _is_out_of_memory
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


class _Display:
    def epoch_done(self):
        pass

    def trial_seconds(self, wall):
        pass


def test_a_resumed_trial_logs_the_epochs_its_killed_driver_never_logged_each_once(tmp_path, monkeypatch):
    """A driver killed after its trial's epoch 2 was checkpointed but before that epoch was logged:
    the rerun's trial continues after epoch 2 and reports only its final result, whose epoch
    history has the driver log epoch 2 (epoch 1, logged before the kill, is not logged again)."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = tracker.experiment_id("s")
    run = tracker.start_trial_run(experiment, "cell-a-t0", "cell-a/cell-a-t0", {}, {})
    epochs = [{"epoch": 1, "epoch_train_seconds": 3.0, "val_ndcg_at_10": 0.25, "train_loss": 0.5},
              {"epoch": 2, "epoch_train_seconds": 4.0, "val_ndcg_at_10": 0.5, "train_loss": 0.25}]
    killed = MlflowTrialLogger(tracker, experiment, {}, None, _Display(), None)
    killed.runs = {"tune-1": run}
    killed.on_trial_result(0, [], SimpleNamespace(trial_id="tune-1"), {**epochs[0], "time_this_iter_s": 9.0})

    rerun = MlflowTrialLogger(tracker, experiment, {}, None, _Display(), None)
    rerun.runs = {"tune-2": run}
    rerun.on_trial_result(0, [], SimpleNamespace(trial_id="tune-2"),
                          {"final": 1, "val_ndcg_at_10": 0.5, "best_epoch": 2, "best_checkpoint": "/c", EPOCH_HISTORY: json.dumps(epochs)})
    history = {name: [(m.step, m.value) for m in sorted(tracker.client.get_metric_history(run, name), key=lambda m: m.step)]
               for name in ("epoch_train_seconds", "val_ndcg_at_10", "train_loss")}
    assert history == {"epoch_train_seconds": [(1, 3.0), (2, 4.0)], "val_ndcg_at_10": [(1, 0.25), (2, 0.5)],
                       "train_loss": [(1, 0.5), (2, 0.25)]}
    assert tracker.client.get_metric_history(run, "time_this_iter_s") == []  # (Tune's bookkeeping is not an epoch metric)

    # a trial whose every epoch came through this driver: nothing logged twice, MLflow not asked
    live = MlflowTrialLogger(tracker, experiment, {}, None, _Display(), None)
    other = tracker.start_trial_run(experiment, "cell-a-t1", "cell-a/cell-a-t1", {}, {})
    live.runs = {"tune-3": other}
    for epoch in epochs:
        live.on_trial_result(0, [], SimpleNamespace(trial_id="tune-3"), epoch)
    history_of = tracker.client.get_metric_history
    monkeypatch.setattr(tracker.client, "get_metric_history", lambda *a: pytest.fail("MLflow asked for a run's history"))
    live.on_trial_result(0, [], SimpleNamespace(trial_id="tune-3"),
                         {"final": 1, "best_checkpoint": "/c", EPOCH_HISTORY: json.dumps(epochs)})
    assert [m.step for m in history_of(other, "epoch_train_seconds")] == [1, 2]
    # a pruned trial's result carries its epochs too
    rerun.runs["tune-4"] = pruned = tracker.start_trial_run(experiment, "cell-a-t2", "cell-a/cell-a-t2", {}, {})
    monkeypatch.setattr(tracker.client, "get_metric_history", history_of)
    rerun.on_trial_result(0, [], SimpleNamespace(trial_id="tune-4"), {"pruned_at_epoch": 2, EPOCH_HISTORY: json.dumps(epochs)})
    assert [m.step for m in history_of(pruned, "epoch_train_seconds")] == [1, 2]
