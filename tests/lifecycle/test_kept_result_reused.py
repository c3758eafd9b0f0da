"""A second `orchestrate run` of a trial whose kind keeps its result outside the run store (dense,
EAR, selector) prints the run that produced it: its id, its chosen epoch, its tests (it printed
run id "", chosen epoch 0 and an empty table)."""

import dataclasses
import json

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import trial_key
from orchestrator.lifecycle.run import RayTrialSteps
from workloads.kinds import kind_of
from workloads.kinds.dense.spec import DenseTrialSpec

SPEC = DenseTrialSpec.model_validate({"kind": "dense", "name": "d", "data": {"collection": "beir/scifact"},
                                      "model": {"name": "minilm-l6"}})
METRICS = {schema.BEST_EPOCH: 1.0, "best_val_ndcg_at_10": 0.61, "test_ndcg_at_10": 0.58}


def _steps(tracker):
    return RayTrialSteps(SPEC, tracker, None, None, False, None, None, {}, None)


def test_a_reused_kept_result_reports_the_run_that_produced_it(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    kind = dataclasses.replace(kind_of(SPEC), finished=lambda spec: tmp_path)  # trained and kept here
    (tmp_path / kind.result_file).write_text(json.dumps(METRICS))
    steps = _steps(tracker)
    run_id = tracker.start_trial_run(steps.experiment_id(), "d", trial_key(SPEC), {}, {})
    tracker.log_metrics(run_id, METRICS)
    tracker.finish(run_id)

    reused = _steps(tracker).reused(kind, SPEC)
    assert (reused.run_id, reused.reused, reused.best_epoch, reused.kept) == (run_id, True, 1, tmp_path)
    assert reused.validation.model == {"ndcg_at_10": 0.61} and reused.tests[schema.TEST].model == {"ndcg_at_10": 0.58}


def test_a_kept_result_this_store_has_no_run_of_reports_its_kept_summary(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    kind = dataclasses.replace(kind_of(SPEC), finished=lambda spec: tmp_path)
    (tmp_path / kind.result_file).write_text(json.dumps({**METRICS, "note": "not a number"}))
    reused = _steps(tracker).reused(kind, SPEC)
    assert (reused.run_id, reused.best_epoch, reused.tests[schema.TEST].model) == ("", 1, {"ndcg_at_10": 0.58})
