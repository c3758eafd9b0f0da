"""A resumed sweep repairs what an earlier driver left behind: trial runs tagged with an older
axis vocabulary, and trial runs left open after their Optuna trial had ended."""

import optuna
import pytest

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.runner import _cell_runs, migrate_trial_axes
from orchestrator.sweep.search import (
    COUNTED,
    FAILURE,
    TRAIN_RUN,
    CellStudiesSearcher,
    finished_trials,
    requeue_interrupted,
    stop_file,
)
from orchestrator.sweep.tune import reconcile_trial_runs

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



def test_a_run_taken_up_again_no_longer_says_why_an_earlier_attempt_stopped(store):
    """A trial run bad input failed (or Ctrl-C stopped) is reused by the next run of the sweep: once
    taken up, it carries no failure of the earlier attempt (a FINISHED run tagged failure=input lied)."""
    _, tracker, _, cells, experiment, cell_runs = store
    key = f"{cells[0].key}/t0"
    run = tracker.start_trial_run(experiment, "t0", key, {}, {schema.CELL_TAG: cells[0].key})
    tracker.fail(run, "input", "model: cannot load model or tokenizer")
    assert tracker.start_trial_run(experiment, "t0", key, {}, {schema.CELL_TAG: cells[0].key}) == run  # no duplicate
    again = tracker.client.get_run(run)
    assert again.info.status == "RUNNING"
    assert not {schema.FAILURE_TAG, schema.ERROR_TAG, schema.INTERRUPTED_TAG} & set(again.data.tags)

def test_a_pruned_trial_is_recorded_never_retried_and_resume_keeps_it(tmp_path):
    """The cell's pruner with the real searcher and an Optuna SQLite storage, fed as Tune feeds
    it: a trial below the median of its cell's earlier trials at an epoch is asked to stop (its
    stop file appears; the training loop honours it, see test_training_objective), reports
    where it stopped, is recorded PRUNED, counts as done, is not re-asked by a resumed
    searcher, and its MLflow run (left open by a killed driver) is closed as KILLED."""
    spec = {**SWEEP, "base": {**SWEEP["base"], "optimization": {"epochs": 3}},
            "search": {"trials_per_cell": 4, "pruner": "median", "pruner_startup_trials": 1}}
    sweep = SweepSpec.model_validate(spec)
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = CellStudiesSearcher(cells[:1], sweep.search, url)
    searcher.storage = str(tmp_path / "ray")
    study = searcher.studies[cells[0].key]

    def epochs(trial_id, values):
        """Feed the epochs; which trials have been asked to stop after each."""
        asked = []
        for e, v in enumerate(values, 1):
            searcher.on_trial_result(trial_id, {"val_ndcg_at_10": v, "epoch": e})
            asked.append(trial_id in searcher.pruning)
        return asked

    def finish(trial_id, value):
        searcher.on_trial_result(trial_id, {"val_ndcg_at_10": value, "final": 1})
        searcher.on_trial_complete(trial_id, {"val_ndcg_at_10": value, "final": 1})

    searcher.suggest("a")
    assert epochs("a", [0.5, 0.6, 0.7]) == [False] * 3  # the first trial: nothing to compare with
    finish("a", 0.7)
    config = searcher.suggest("b")
    assert epochs("b", [0.1]) == [True]  # below a's 0.5 after epoch 1: asked to stop
    marker = stop_file(tmp_path / "ray", config["train_run"])
    assert marker.exists() and not stop_file(tmp_path / "ray", "other").exists()
    searcher.on_trial_result("b", {schema.PRUNED_TAG: 1})  # what the trial reports once its loop returned
    searcher.on_trial_complete("b", {schema.PRUNED_TAG: 1})
    searcher.suggest("d")
    # best-so-far 0.65 is below a's 0.7 at epoch 3, but a trial that trained its last epoch is kept
    assert epochs("d", [0.55, 0.65, 0.1]) == [False] * 3
    finish("d", 0.65)
    searcher.suggest("c")
    assert epochs("c", [0.9]) == [False]  # above the median; then the driver is killed
    states = {t.number: t.state for t in study.get_trials()}
    assert states[1] == optuna.trial.TrialState.PRUNED and study.trials[1].user_attrs[schema.PRUNED_TAG] == 1
    assert study.best_trial.number == 0  # a pruned trial is never the winner

    # a run left open by a killed driver is closed from the PRUNED outcome
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = tracker.experiment_id(sweep.name)
    run = tracker.start_trial_run(experiment, config["train_run"], f"{cells[0].key}/{config['train_run']}", {}, {})
    # resume: a new searcher on the same storage
    resumed = CellStudiesSearcher(cells[:1], sweep.search, url)
    assert reconcile_trial_runs(tracker, experiment, resumed) == 1
    closed = tracker.client.get_run(run)
    assert closed.info.status == "KILLED" and closed.data.tags[schema.PRUNED_TAG] == "1"
    assert requeue_interrupted(resumed.studies[cells[0].key]) == 1  # c was left RUNNING: re-asked; b is not
    assert finished_trials(resumed.studies[cells[0].key]) == 3      # a, d (complete) and b (pruned) used their slots
    assert resumed.remaining() == 1
    again = resumed.suggest("c2")
    assert again["train_run"].endswith("-t3")  # the interrupted trial c, resumed from its checkpoints, not b
    assert resumed.suggest("e") is None  # every slot used or in flight: nothing new to ask
