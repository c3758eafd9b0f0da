"""Bad input that only a sweep's Train worker meets (a model directory without its weights: the
driver checks that the directory exists, the worker loads it) ends the sweep with one line and
exit 2, is not retried (by Train nor by Tune), loses nothing, and a rerun once the cause is
removed completes the sweep without duplicate runs."""

import json
import os
import shutil

import optuna
import pytest

from tests.helpers import by_kind, mlflow_runs, run_cli, sweep_yaml

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

WEIGHTS = "model.safetensors"


def _train_workers() -> int:
    """Ray Train worker actors the session's Ray has started, dead ones included (one per attempt
    of a trial's one-worker group: a retry by Train or by Tune starts another)."""
    from ray.util.state import list_actors

    actors = list_actors(address=os.environ["RAY_API_SERVER_ADDRESS"], limit=10_000, raise_on_missing_output=False)
    return sum("TrainWorker" in actor.class_name for actor in actors)


def test_bad_input_in_a_train_worker_stops_the_sweep_in_one_line_and_a_rerun_completes(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / WEIGHTS).rename(tmp_path / WEIGHTS)  # the directory exists (the driver's check passes); no weights
    spec = sweep_yaml(tmp_path / "bad.yaml", model, "tiny-bad-input", [{"ranking": "pointwise"}],
                      augmentations=({"method": "none"},))  # one cell, two trials
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri, "--max-concurrent", "1"]

    workers_before = _train_workers()
    failed = run_cli(tmp_path, "sweep", str(spec), "--json", *common)
    assert failed.returncode == 2, failed.stderr[-3000:]
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {model}: cannot load model or tokenizer ("), failed.stderr
    assert WEIGHTS in errors[0]  # names what is missing
    assert "Traceback" not in failed.stderr and failed.stdout == ""
    # one attempt: neither Train (resources.max_failures) nor Tune (max_failures: 1) tried again,
    # and the sweep stopped before its second trial met the same input
    assert _train_workers() - workers_before == 1

    client, runs = mlflow_runs(uri, "tiny-bad-input")
    trials = by_kind(runs, "trial")
    assert [(t.info.status, t.data.tags.get("failure")) for t in trials] == [("FAILED", "input")]
    assert trials[0].data.tags["error"] == errors[0].removeprefix("error: ")  # what `status` lists it with
    assert not [r for r in runs if r.info.status == "RUNNING"]  # `status` would count them as running forever
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'store' / 'tiny-bad-input' / 'optuna.db'}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]  # not a counted failure: run again

    (tmp_path / WEIGHTS).rename(model / WEIGHTS)  # the cause removed
    again = run_cli(tmp_path, "sweep", str(spec), "--json", *common)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["trials_done"] == 2
    client, runs = mlflow_runs(uri, "tiny-bad-input")
    trials = by_kind(runs, "trial")
    assert (len(by_kind(runs, "sweep")), len(by_kind(runs, "cell")), len(trials)) == (1, 1, 2)
    assert len({r.data.tags["rerank_lab.trial_key"] for r in runs}) == 4  # the failed trial's run was taken up again
    unfinished = [(r.data.tags.get("rerank_lab.kind"), r.info.status) for r in runs if r.info.status != "FINISHED"]
    assert not unfinished, (unfinished, again.stderr[-3000:])
    assert not [r.data.tags.get("rerank_lab.kind") for r in runs if "failure" in r.data.tags or "error" in r.data.tags]
    assert all("best_val_ndcg_at_10" in t.data.metrics for t in trials)
