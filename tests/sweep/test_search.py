"""Per-cell searches across restarts: a trial draws by its slot, and no cell draws a parameter set twice."""

import pickle
from concurrent.futures import Future

import optuna

from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.search import (
    COUNTED,
    FAILURE,
    INPUT_FAILURE,
    TRAIN_RUN,
    CellStudiesSearcher,
    TrialConfig,
    open_study,
    requeue_interrupted,
    sample,
)

SWEEP = {"name": "s", "base": {"data": {"collection": "beir/scifact"}},
         "grid": {"models": ["m"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
                  "augmentations": [{"method": "bm25"}], "sizes": [100]},
         "search": {"trials_per_cell": 4, "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
                    "lambda": {"low": 0.0, "high": 1.0}, "tau": {"low": 0.05, "high": 0.5}, "k": {"choices": [1, 2]}}}


def _cell(search=None):
    sweep = SweepSpec.model_validate({**SWEEP, "search": {**SWEEP["search"], **(search or {})}})
    return sweep, next(c for c in expand_grid(sweep) if not c.is_baseline)


def _draw(study, cell, search):
    trial = study.ask()
    params = sample(trial, cell, search)
    study.tell(trial, 0.5)
    return params


def _finish(searcher, tune_id, value):
    searcher.on_trial_result(tune_id, {"val_ndcg_at_10": value, "epoch": 1, "final": 1})
    searcher.on_trial_complete(tune_id, {"val_ndcg_at_10": value})


def test_a_trial_draws_by_its_slot_so_a_killed_driver_changes_no_name_or_draw(tmp_path):
    """The cell's k-th trial has the same Train run name and parameters whether or not a driver
    was killed while an earlier one ran (its rerun fails that Optuna trial and asks it again as a
    new one, which took the next trial's number and a restarted sampler's draw before), through
    TPE's startup draws and past them (one trial at a time: TPE then reads the same finished trials)."""
    sweep, cell = _cell({"trials_per_cell": 6})  # TPE's 4 random startup draws, then 2 from its model of the finished
    clean = CellStudiesSearcher([cell], sweep.search, f"sqlite:///{tmp_path / 'clean.db'}")
    expected = []
    for number in range(6):
        expected.append(clean.suggest(f"c{number}"))
        _finish(clean, f"c{number}", 0.1 * number)

    url = f"sqlite:///{tmp_path / 'killed.db'}"
    first = CellStudiesSearcher([cell], sweep.search, url).suggest("k0")  # the driver is killed while it runs
    resumed = CellStudiesSearcher([cell], sweep.search, url)
    assert requeue_interrupted(resumed.studies[cell.key]) == 1
    got = [resumed.suggest("k0-again")]
    _finish(resumed, "k0-again", 0.0)
    for number in range(1, 6):
        got.append(resumed.suggest(f"k{number}"))
        _finish(resumed, f"k{number}", 0.1 * number)
    assert (first["train_run"], first["params"]) == (got[0]["train_run"], got[0]["params"])
    assert [(c["train_run"], c["params"]) for c in got] == [(c["train_run"], c["params"]) for c in expected]
    assert [c["train_run"] for c in got] == [f"{cell.key}-t{n}" for n in range(6)]
    assert [c["optuna_trial"] for c in got] == [1, 2, 3, 4, 5, 6]  # Optuna's numbers moved on; the names did not
    assert len({tuple(sorted(c["params"].items())) for c in got}) == 6  # each slot draws anew


def test_the_searcher_never_hands_out_a_parameter_set_the_cell_tried(tmp_path):
    """A finite space (k x learning rate: 4 sets) and 4 trials per cell: the 4 trials handed out are the 4
    distinct sets, though the sampler repeats itself; repeated draws are uncounted failures."""
    sweep, cell = _cell({"learning_rate": {"choices": [1e-4, 3e-4]}, "lambda": {"choices": [0.5]},
                         "tau": {"choices": [0.1]}})
    searcher = CellStudiesSearcher([cell], sweep.search, f"sqlite:///{tmp_path / 'optuna.db'}")
    handed = []
    for number in range(4):
        config = searcher.suggest(f"t{number}")
        handed.append(tuple(sorted(config["params"].items())))
        searcher.on_trial_result(f"t{number}", {"val_ndcg_at_10": 0.1 * number, "epoch": 1, "final": 1})
        searcher.on_trial_complete(f"t{number}", {"val_ndcg_at_10": 0.1 * number})
    assert len(set(handed)) == 4
    study = searcher.studies[cell.key]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    repeated = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(not t.user_attrs.get(COUNTED) for t in repeated)  # they ran nothing and use up no slot
    assert searcher.suggest("t9") == "FINISHED"


def test_an_interrupted_trial_is_asked_again_with_its_parameters(tmp_path):
    sweep, cell = _cell()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = CellStudiesSearcher([cell], sweep.search, url)
    config = searcher.suggest("t0")  # the driver dies while it runs
    study = open_study(url, cell, sweep.search)
    assert requeue_interrupted(study) == 1
    again = CellStudiesSearcher([cell], sweep.search, url).suggest("t1")
    assert again["params"] == config["params"] and again["train_run"] == config["train_run"]
    assert study.trials[-1].user_attrs[TRAIN_RUN] == config["train_run"]


def test_a_cell_waits_only_for_its_own_requirement(tmp_path):
    """A gated cell (its selector training) is not served while its gate is pending; the other cell
    is; the searcher is not finished while a gate is pending, and a failed gate ends its cell unserved."""
    sweep = SweepSpec.model_validate({**SWEEP, "search": {**SWEEP["search"], "trials_per_cell": 1},
                                      "grid": {**SWEEP["grid"], "augmentations": [{"method": "bm25"}, {"method": "random"}]}})
    free, gated = [c for c in expand_grid(sweep) if not c.is_baseline][:2]
    searcher = CellStudiesSearcher([gated, free], sweep.search, f"sqlite:///{tmp_path / 'optuna.db'}")
    gate = Future()
    searcher.gates = {gated.key: gate}
    assert searcher.suggest("t0")["cell"] == free.key  # the gated cell comes first in round-robin order
    searcher.on_trial_complete("t0", {"val_ndcg_at_10": 0.5})
    assert searcher.suggest("t1") is None  # nothing to serve now, but the gated cell will come: not FINISHED
    assert pickle.loads(pickle.dumps(searcher)).gates == {}  # Tune saves its searcher: the Futures stay here
    gate.set_exception(RuntimeError("its required trial failed"))
    assert searcher.suggest("t2") == "FINISHED"
    ready = Future()
    ready.set_result(None)
    searcher.gates = {gated.key: ready}
    assert searcher.suggest("t3")["cell"] == gated.key


def test_the_trial_config_tune_carries_reads_back_as_it_was_written(tmp_path):
    """What the searcher hands Tune is a plain dict (Tune saves it with its experiment state); the
    Tune trial and the MLflow logger read it back typed, a config saved before cells had kinds too."""
    sweep, cell = _cell()
    searcher = CellStudiesSearcher([cell], sweep.search, f"sqlite:///{tmp_path / 'optuna.db'}")
    searcher.storage = str(tmp_path / "ray")
    written = searcher.suggest("tune-1")
    assert isinstance(written, dict) and pickle.loads(pickle.dumps(written)) == written
    config = TrialConfig.of(written)
    assert config.as_dict() == written and config.cell == cell.key and config.storage == str(tmp_path / "ray")
    assert config.trial_spec().optimization.learning_rate == written["params"]["learning_rate"]
    older = {k: v for k, v in written.items() if k not in ("kind", "axes", "tags")}
    assert TrialConfig.of(older).trial_kind.name == "rerank" and TrialConfig.of(older).axes == {}


def test_a_trial_that_met_bad_input_is_asked_again_once_the_input_is_fixed(tmp_path):
    """Bad input stops the sweep: the trial that met it used up none of its cell's trials (it is
    left RUNNING, so the next run asks it again with its parameters and Train run name)."""
    sweep, cell = _cell()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = CellStudiesSearcher([cell], sweep.search, url)
    config = searcher.suggest("t0")
    searcher.on_trial_result("t0", {FAILURE: INPUT_FAILURE, "val_ndcg_at_10": float("nan")})
    searcher.on_trial_complete("t0", {FAILURE: INPUT_FAILURE, "val_ndcg_at_10": float("nan")})
    study = open_study(url, cell, sweep.search)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]
    assert requeue_interrupted(study) == 1
    again = CellStudiesSearcher([cell], sweep.search, url).suggest("t1")
    assert again["params"] == config["params"] and again["train_run"] == config["train_run"]
