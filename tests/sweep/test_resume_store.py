"""A resumed sweep repairs what an earlier driver left behind: trial runs tagged with an older
axis vocabulary, and trial runs left open after their Optuna trial had ended."""

import optuna
import pytest

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.runner import _cell_runs, migrate_trial_axes, reconcile_trial_runs
from orchestrator.sweep.search import COUNTED, FAILURE, TRAIN_RUN, CellStudiesSearcher

SWEEP = {
    "name": "resume",
    "base": {"data": {"collection": "beir/scifact"}},
    "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
             "augmentations": [{"method": "bm25", "k": 2}], "sizes": [100]},
    "search": {"trials_per_cell": 2},
}


@pytest.fixture()
def store(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep = SweepSpec.model_validate(SWEEP)
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    experiment = tracker.experiment_id(sweep.name)
    return tmp_path, tracker, sweep, cells, experiment, _cell_runs(tracker, experiment, sweep, cells)


def test_trial_runs_of_an_older_store_get_their_cells_axis_tags(store):
    _, tracker, _, cells, experiment, cell_runs = store
    cell = next(c for c in cells if c.axes["augmentation"] == "bm25")
    # as written before one vocabulary: k_a inside the augmentation axis, no collection tag
    old = tracker.start_trial_run(experiment, "t0", f"{cell.key}/t0", {}, {
        schema.CELL_TAG: cell.key, "model": "tiny", "loss": "pointwise+scl", "augmentation": "bm25-k2", "size": "100", "seed": "13"})
    assert migrate_trial_axes(tracker, experiment, cell_runs) == 1
    tags = tracker.client.get_run(old).data.tags
    cell_tags = tracker.client.get_run(cell_runs[cell.key]).data.tags
    assert {a: tags[a] for a in schema.AXES} == {a: cell_tags[a] for a in schema.AXES}
    assert tags["augmentation"] == "bm25" and tags["collection"] == "beir/scifact"
    assert migrate_trial_axes(tracker, experiment, cell_runs) == 0  # idempotent


def test_trial_runs_left_open_are_closed_from_their_optuna_outcome(store):
    tmp_path, tracker, sweep, cells, experiment, _ = store
    searcher = CellStudiesSearcher(cells, sweep.search, f"sqlite:///{tmp_path / 'optuna.db'}")
    cell = cells[0]
    study = searcher.studies[cell.key]
    done, failed = study.ask(), study.ask()
    for trial, name in ((done, "t0"), (failed, "t1")):
        trial.set_user_attr(TRAIN_RUN, name)
    failed.set_user_attr(COUNTED, True)
    failed.set_user_attr(FAILURE, "oom")
    study.tell(done, 0.42)  # the searcher was told ...
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    # ... but the driver died before the callbacks closed the MLflow runs
    run_done = tracker.start_trial_run(experiment, "t0", f"{cell.key}/t0", {}, {schema.CELL_TAG: cell.key})
    run_failed = tracker.start_trial_run(experiment, "t1", f"{cell.key}/t1", {}, {schema.CELL_TAG: cell.key})
    assert reconcile_trial_runs(tracker, experiment, searcher) == 2
    finished, failure = tracker.client.get_run(run_done), tracker.client.get_run(run_failed)
    assert finished.info.status == "FINISHED" and finished.data.metrics[schema.BEST_OBJECTIVE] == 0.42
    assert failure.info.status == "FAILED" and failure.data.tags[schema.FAILURE_TAG] == "oom"
    assert reconcile_trial_runs(tracker, experiment, searcher) == 0  # nothing left open
