"""What a compared table's legend and intervals say: the interval at the markers' family level,
the t interval on few queries, the one-seed note and the warning when no marker is reachable."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from orchestrator.report.legend import unreachable
from tests.report.test_report import _by_name, _table, store  # noqa: F401  (the shared fixture; F811 below: its use)
from workloads.evaluation.statistics import compare_uncertainty

ONE_SEED_NOTE = ("One training run (seed) per cell: a marker says this run differs from its baseline's run on these "
                 "queries, not that a retrain would (train with several seeds for that).")


def _scl_difference(report):
    *_, values = report
    return values[("pointwise+scl", "bm25", "100")][0] - values[("pointwise", "none", "100")][0]


@pytest.mark.parametrize(("family", "correction", "size"), [("sweep", "holm", 4), ("sweep", "bonferroni", 4),
                                                            (None, "holm", 2)])
def test_holm_and_bonferroni_intervals_are_at_the_family_level(store, family, correction, size):  # noqa: F811
    d = _scl_difference(store)
    level = 1 - 0.05 / size  # Bonferroni's level over the family the markers are corrected in
    expected = stats.t.interval(level, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    table = _table(store, family=family, correction=correction, ci=True)
    assert _by_name(table, ("tiny", "100"))["bm25 / pointwise+scl"].ci == pytest.approx(expected, abs=1e-12)
    line = next(n for n in table.notes if n.startswith("[low, high]"))
    assert line.startswith(f"[low, high]: {100 * level:.4g}% (Bonferroni's level over the family's {size} comparisons, "
                           "as the markers are corrected) t interval of the difference")


def test_bh_intervals_stay_at_95_and_the_legend_says_they_are_not_adjusted(store):  # noqa: F811
    d = _scl_difference(store)
    table = _table(store, family="sweep", correction="bh", ci=True)
    expected = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert _by_name(table, ("tiny", "100"))["bm25 / pointwise+scl"].ci == pytest.approx(expected, abs=1e-12)
    assert any(n.startswith("[low, high]: 95% (not adjusted: Benjamini-Hochberg's markers bound false discoveries, "
                            "not intervals) t interval") for n in table.notes)


def test_the_interval_on_43_queries_is_scipys_t_interval():
    """TREC DL 2019's 43 queries, skewed and half zero (IR's shape): the percentile bootstrap
    covered 0.92 there, the t interval 0.96 (benchmarks/stat_calibration.py)."""
    rng = np.random.default_rng(7)
    d = np.where(rng.random(43) < 0.5, 0.0, rng.exponential(0.1, 43) - 0.05)
    queries = [f"q{i}" for i in range(43)]
    system = {"13": {q: 0.5 + x for q, x in zip(queries, d)}}
    baseline = {"13": dict.fromkeys(queries, 0.5)}
    interval = compare_uncertainty(system, baseline).interval
    d = np.array([system["13"][q] - 0.5 for q in queries])  # the differences as floats hold them
    assert (interval.low, interval.high) == pytest.approx(stats.t.interval(0.95, 42, loc=d.mean(), scale=stats.sem(d)),
                                                          abs=1e-12)


def test_a_one_seed_table_says_its_markers_are_about_one_training_run(store):  # noqa: F811
    assert ONE_SEED_NOTE in _table(store).notes
    assert ONE_SEED_NOTE in _table(store, family="sweep", correction="bh", ci=True).notes


def test_a_family_that_cannot_reach_the_threshold_is_warned_about():
    # Wilcoxon's exact smallest p on 10 queries is 2 / 2^10; Holm over 30 comparisons: 30 / 512 = 0.0586 >= 0.05
    assert unreachable("wilcoxon", "holm", 30, 10) == (
        "Warning: no comparison can be marked †: on 10 queries the wilcoxon test's smallest p-value, "
        "Holm-corrected over 30 comparisons, is 0.0586.")
    assert unreachable("wilcoxon", "holm", 25, 10) is None  # 25 / 512 = 0.049: one can be marked
    assert unreachable("wilcoxon", "bh", 30, 10) is None  # BH: the largest p is held to 0.05 itself, no floor
    assert unreachable("t", "bonferroni", 1000, 10) is None  # the t-test's p has no floor
