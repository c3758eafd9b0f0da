"""Seeds, bootstrap intervals, direction, effect size and multiple-comparison corrections, against
values computed here independently (numpy resampling, hand arithmetic) or published."""

import warnings

import numpy as np
import pytest
from scipy import stats

from workloads.evaluation.significance import adjust_p_values
from workloads.evaluation.statistics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    bootstrap_interval,
    compare_uncertainty,
    difference_matrix,
    direction,
    effect_size,
    seed_summary,
)


def _t_reference(d: np.ndarray, confidence: float = 0.95):
    """scipy's paired t interval of the mean of ``d`` (one seed)."""
    d = np.asarray(d, dtype=float)
    return tuple(stats.ttest_1samp(d, 0.0).confidence_interval(confidence))


def _crossed_reference(d: np.ndarray, confidence: float = 0.95):
    """By hand, cell by cell: the crossed random-effects (seeds x queries) t interval of the mean."""
    s, n = d.shape
    grand = sum(sum(row) for row in d) / (s * n)
    seed_means = [sum(row) / n for row in d]
    query_means = [sum(d[i][j] for i in range(s)) / s for j in range(n)]
    ms_s = n * sum((m - grand) ** 2 for m in seed_means) / (s - 1)
    ms_q = s * sum((m - grand) ** 2 for m in query_means) / (n - 1)
    ms_e = sum((d[i][j] - seed_means[i] - query_means[j] + grand) ** 2 for i in range(s) for j in range(n)) / ((s - 1) * (n - 1))
    var = max(ms_s + ms_q - ms_e, ms_e) / (s * n)  # never below the residual's share
    share = ms_s / (ms_s + ms_q)  # df: the seeds' and queries' df, harmonic mean weighted by share
    df = max(1.0, 1.0 / (share / (s - 1) + (1 - share) / (n - 1)))
    half = stats.t.ppf(0.5 + confidence / 2, df) * var ** 0.5
    return grand - half, grand + half


def _percentile_reference(d: np.ndarray, seed: int = BOOTSTRAP_SEED, resamples: int = BOOTSTRAP_RESAMPLES):
    """The percentile bootstrap by hand: the same generator's draws (one batch of resamples x
    queries indices), each resample's mean, the 2.5% and 97.5% quantiles (linear interpolation)."""
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), (resamples, len(d)))].mean(axis=1)
    return np.quantile(means, [0.025, 0.975])


def _multi_reference(d: np.ndarray, seed: int = BOOTSTRAP_SEED, resamples: int = BOOTSTRAP_RESAMPLES):
    """Seeds and queries resampled independently (seeds' draws first), a loop over resamples."""
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, d.shape[0], (resamples, d.shape[0]))
    queries = rng.integers(0, d.shape[1], (resamples, d.shape[1]))
    means = np.array([d[s][:, q].mean() for s, q in zip(seeds, queries)])
    return np.quantile(means, [0.025, 0.975])


def test_interval_over_queries_is_the_percentile_bootstrap_of_the_mean_difference():
    rng = np.random.default_rng(7)
    d = rng.normal(0.02, 0.1, 50)
    interval = bootstrap_interval(d)
    assert (interval.low, interval.high) == pytest.approx(tuple(_percentile_reference(d)), abs=1e-12)
    assert interval.queries == 50 and interval.seeds == 1 and interval.confidence == 0.95
    assert interval.low < d.mean() < interval.high
    assert bootstrap_interval(d) == interval  # seeded: the same interval every time
    assert bootstrap_interval(d, seed=14) != interval
    # a literal, derived once from this construction (and equal to the reference above at the time)
    assert (interval.low, interval.high) == pytest.approx((-0.03337844068799415, 0.015176018658096724), abs=1e-12)


def test_interval_over_queries_and_seeds_resamples_both():
    rng = np.random.default_rng(8)
    per_query = rng.normal(0.0, 0.1, 30)  # a query's difficulty shared by the seeds
    d = np.vstack([per_query + 0.03 + rng.normal(0, 0.02, 30), per_query + 0.01 + rng.normal(0, 0.02, 30)])
    interval = bootstrap_interval(d)
    assert (interval.low, interval.high) == pytest.approx(tuple(_multi_reference(d)), abs=1e-12)
    assert interval.seeds == 2 and interval.queries == 30
    # wider than pooling the 60 cells as independent queries would claim
    pooled = bootstrap_interval(d.ravel())
    assert interval.high - interval.low > pooled.high - pooled.low


def test_identical_systems_have_a_zero_interval_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        interval = bootstrap_interval(np.zeros(10))
    assert (interval.low, interval.high) == (0.0, 0.0)


def test_seeds_are_paired_by_name_and_averaged_when_they_differ():
    system = {"13": {"a": 0.5, "b": 0.7}, "14": {"a": 0.3, "b": 0.9}}
    baseline = {"14": {"a": 0.1, "b": 0.4}, "13": {"a": 0.2, "b": 0.2}}
    np.testing.assert_allclose(difference_matrix(system, baseline), [[0.3, 0.5], [0.2, 0.5]])
    unpaired = difference_matrix(system, {"99": {"a": 0.0, "b": 0.5}})
    np.testing.assert_allclose(unpaired, [[0.4, 0.3]])
    with pytest.raises(ValueError, match="other queries"):
        difference_matrix(system, {"13": {"a": 0.1}, "14": {"a": 0.1}})


def test_seed_summary_mean_and_sample_standard_deviation():
    summary = seed_summary({"13": {"a": 0.2, "b": 0.4}, "14": {"a": 0.4, "b": 0.6}, "15": {"a": 0.6, "b": 0.8}})
    # per-seed means 0.3, 0.5, 0.7: mean 0.5, sample std sqrt((0.04 + 0 + 0.04) / 2) = 0.2
    assert (summary.mean, summary.std, summary.count) == pytest.approx((0.5, 0.2, 3))
    # the digits, not approximately: each seed's mean from math.fsum (0.1 x 10 is 1.0 exactly), the
    # spread exactly rounded (0.1 and 0.3 differ by 0.2, which is 0.2 / sqrt(2) apart from their mean)
    exact = seed_summary({"13": {str(i): 0.1 for i in range(10)}, "14": {str(i): 0.3 for i in range(10)}})
    assert (exact.mean, exact.std) == (0.2, 0.1414213562373095)
    single = seed_summary({"13": {"a": 0.2, "b": 0.4}})
    assert single.std is None and single.count == 1 and single.mean == pytest.approx(0.3)


def test_direction_and_effect_size_by_hand():
    d = np.array([0.1, 0.1, 0.0, 1e-9, -0.2, 0.3])
    assert direction(d) == direction(np.vstack([d, d]))  # seeds are averaged first
    counts = direction(d)
    assert (counts.won, counts.tied, counts.lost) == (3, 2, 1)  # 1e-9 is rounding: a tie
    # d_z: mean 0.3 / 6 = 0.05; sample std of [0.1, 0.1, 0, 0, -0.2, 0.3]
    hand = 0.05 / np.sqrt(sum((x - 0.05) ** 2 for x in [0.1, 0.1, 0, 0, -0.2, 0.3]) / 5)
    assert effect_size(d) == pytest.approx(hand)
    assert effect_size(np.full(5, 0.1)) is None and effect_size(np.zeros(5)) is None and effect_size(np.array([0.1])) is None


def test_compare_uncertainty_puts_it_together():
    system = {"": {"a": 0.5, "b": 0.7, "c": 0.2}}
    baseline = {"": {"a": 0.4, "b": 0.7, "c": 0.3}}
    u = compare_uncertainty(system, baseline)
    assert u.difference == pytest.approx(0.0)
    assert (u.direction.won, u.direction.tied, u.direction.lost) == (1, 1, 1)
    assert (u.interval.low, u.interval.high) == pytest.approx(_t_reference(np.array([0.1, 0.0, -0.1])))
    assert compare_uncertainty(system, baseline, interval=False).interval is None


# Benjamini & Hochberg (1995), J. R. Statist. Soc. B 57(1), section 4.2: the 15 p-values of a
# myocardial infarction study (Neuhaus et al. 1992). At level 0.05 Bonferroni rejects the 3
# smallest (p <= 0.05 / 15), Benjamini-Hochberg the 4 smallest (p_(4) = 0.0095 <= 4 / 15 * 0.05);
# Holm's step-down stops at the same 3 (p_(4) = 0.0095 > 0.05 / 12).
BH_1995 = [0.0201, 0.0001, 0.0004, 0.0019, 0.0095, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
           0.7590, 1.0000]  # the paper's, first one moved: input order is kept


def _rejected(adjusted, level=0.05):
    return sorted(p for p, a in zip(BH_1995, adjusted) if a < level)


def test_corrections_reject_what_benjamini_and_hochberg_1995_report():
    assert _rejected(adjust_p_values(BH_1995, "bh")) == [0.0001, 0.0004, 0.0019, 0.0095]
    assert _rejected(adjust_p_values(BH_1995, "holm")) == [0.0001, 0.0004, 0.0019]
    assert _rejected(adjust_p_values(BH_1995, "bonferroni")) == [0.0001, 0.0004, 0.0019]
    assert adjust_p_values(BH_1995, "none") == BH_1995


def test_adjusted_p_values_by_hand():
    ordered = sorted(BH_1995)
    holm = dict(zip(BH_1995, adjust_p_values(BH_1995, "holm")))
    # Holm: (15 - i) * p_(i), running maximum, capped at 1
    assert [holm[p] for p in ordered[:9]] == pytest.approx([0.0015, 0.0056, 0.0247, 0.114, 0.2211, 0.278, 0.278, 0.278, 0.3213])
    assert all(holm[p] == 1.0 for p in ordered[9:])
    bh = dict(zip(BH_1995, adjust_p_values(BH_1995, "bh")))
    # BH: 15 / i * p_(i), running minimum from the largest
    by_hand = [min(1.0, min(15 / (j + 1) * ordered[j] for j in range(i, 15))) for i in range(15)]
    assert [bh[p] for p in ordered] == pytest.approx(by_hand)
    assert bh[0.0095] == pytest.approx(15 / 4 * 0.0095) and bh[0.0201] == pytest.approx(15 / 5 * 0.0201)
    bonferroni = dict(zip(BH_1995, adjust_p_values(BH_1995, "bonferroni")))
    assert bonferroni[0.0019] == pytest.approx(0.0285) and bonferroni[0.0459] == pytest.approx(0.6885)
