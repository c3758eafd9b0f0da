"""A cell of several seeds: its mean and spread in the tables, the interval that resamples the
queries and the seeds, and what the sweep logs on its cell runs (a store written the way a
sweep writes it, as in ``test_report.py``)."""

import csv
import io
import math

import numpy as np
import pytest

from orchestrator.core.tracking import Tracker
from orchestrator.report.render import render_csv, render_markdown
from orchestrator.report.results import load_sweep_results
from orchestrator.report.tables import TableOptions, grid_table
from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.runner import _cell_runs
from orchestrator.sweep.winners import log_cell_statistics
from tests.report.test_report import QUERIES, _by_name, _evaluation
from tests.workloads.evaluation.test_statistics import _crossed_reference

TWO_SEEDS = {
    "name": "two-seeds",
    "base": {"data": {"collection": "beir/scifact"}},
    "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
             "augmentations": [{"method": "bm25", "k": 2}], "sizes": [100], "seeds": [13, 14]},
    "search": {"trials_per_cell": 1},
}


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory):
    """A sweep of two seeds: a baseline and an SCL system per seed, each seed its own values."""
    work = tmp_path_factory.mktemp("seeds")
    tracker = Tracker(f"sqlite:///{work / 'mlflow.db'}")
    sweep = SweepSpec.model_validate(TWO_SEEDS)
    cells = {(c.axes["loss"], c.axes["seed"]): c for c in expand_grid(sweep)}
    rng = np.random.default_rng(5)
    difficulty = rng.uniform(0.2, 0.6, len(QUERIES))
    values = {("pointwise", "13"): difficulty, ("pointwise", "14"): difficulty + 0.02,
              ("pointwise+scl", "13"): difficulty + 0.05 + rng.normal(0, 0.03, len(QUERIES)),
              ("pointwise+scl", "14"): difficulty + 0.01 + rng.normal(0, 0.03, len(QUERIES))}
    runs = _cell_runs(tracker, tracker.experiment_id(sweep.name), sweep, list(cells.values()))
    for key, test in values.items():
        run_id = runs[cells[key].key]
        tracker.log_evaluation(run_id, "test_", _evaluation(test, QUERIES))
        tracker.log_metrics(run_id, {"best_val_ndcg_at_10": 0.4, "trials_complete": 1})
        tracker.finish(run_id)
    return tracker, sweep, runs, cells, values


def test_a_cell_of_two_seeds_shows_their_mean_and_spread(two_seeds):
    tracker, sweep, _, _, values = two_seeds
    table = grid_table(load_sweep_results(sweep, tracker), "test_", "scifact", ("model", "size"), "augmentation",
                       TableOptions(ci=True, seeds=True))
    row = _by_name(table, ("tiny", "100"))
    scl, base = row["bm25 / pointwise+scl"], row["baseline"]
    m13, m14 = (math.fsum(values[("pointwise+scl", s)]) / len(QUERIES) for s in ("13", "14"))  # each seed's digits
    assert scl.value == pytest.approx((m13 + m14) / 2) and scl.seeds == 2
    assert scl.seed_std == pytest.approx(abs(m13 - m14) / np.sqrt(2))  # the sample std of two numbers
    assert base.seed_std == pytest.approx(0.02 / np.sqrt(2))
    assert dict(scl.per_seed) == pytest.approx({"13": m13, "14": m14})
    d = np.vstack([values[("pointwise+scl", s)] - values[("pointwise", s)] for s in ("13", "14")])  # seed by seed
    assert scl.ci == pytest.approx(tuple(_crossed_reference(d)), abs=1e-12)
    md = render_markdown(table)
    assert f"**{scl.value:.4f}** ± {scl.seed_std:.4f} (" in md and f"13: {m13:.4f}, 14: {m14:.4f}" in md
    assert "seeds and queries both random" in md and "(2 seeds)" in md
    record = next(r for r in csv.DictReader(io.StringIO(render_csv(table))) if r["column"] == "bm25 / pointwise+scl")
    assert record["seeds"] == "2" and float(record["seed_std"]) == pytest.approx(scl.seed_std)
    assert record["seed_values"] == f"13={float(m13)!r};14={float(m14)!r}"
    plain = grid_table(load_sweep_results(sweep, tracker), "test_", "scifact", ("model", "size"), "augmentation", TableOptions())
    assert f"± {scl.seed_std:.4f}" in render_markdown(plain) and "each seed" not in render_markdown(plain)


def test_a_sweep_logs_seeds_and_intervals_on_its_cell_runs(two_seeds):
    """What the MLflow UI compares: on every cell run of a system, under the target's section."""
    from mlflow.tracking import MlflowClient

    tracker, sweep, runs, cells, values = two_seeds
    experiment = tracker.client.get_experiment_by_name(sweep.name).experiment_id
    assert log_cell_statistics(sweep, tracker, experiment) == 4
    raw = MlflowClient(tracker.uri)  # the names as stored
    scl = raw.get_run(runs[cells[("pointwise+scl", "14")].key]).data.metrics
    m13, m14 = values[("pointwise+scl", "13")].mean(), values[("pointwise+scl", "14")].mean()
    assert scl["test/ndcg_at_10_seed_mean"] == pytest.approx((m13 + m14) / 2)
    assert scl["test/ndcg_at_10_seed_std"] == pytest.approx(abs(m13 - m14) / np.sqrt(2))
    assert scl["test/ndcg_at_10_seeds"] == 2
    d = np.vstack([values[("pointwise+scl", s)] - values[("pointwise", s)] for s in ("13", "14")])
    low, high = _crossed_reference(d)
    assert (scl["test/ndcg_at_10_ci_low"], scl["test/ndcg_at_10_ci_high"]) == pytest.approx((low, high), abs=1e-12)
    assert scl["test/ndcg_at_10_difference"] == pytest.approx(d.mean())
    assert raw.get_run(runs[cells[("pointwise+scl", "13")].key]).data.metrics["test/ndcg_at_10_ci_low"] == pytest.approx(low)
    baseline = raw.get_run(runs[cells[("pointwise", "13")].key]).data.metrics
    assert baseline["test/ndcg_at_10_seed_std"] == pytest.approx(0.02 / np.sqrt(2))
    assert not any(k.endswith(("_ci_low", "_difference")) for k in baseline)  # a baseline is not compared with itself
