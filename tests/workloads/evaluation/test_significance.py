"""Paired tests against scipy on constructed per-query data; corrections against hand values."""

import numpy as np
import pytest
from scipy import stats

from workloads.evaluation.significance import (
    PAIRED_TESTS,
    adjust_p_values,
    paired_test,
    randomization_resamples,
    relative_change,
    significance_level,
)

QUERIES = [f"q{i}" for i in range(40)]


def _per_query(values) -> dict[str, float]:
    return dict(zip(QUERIES, map(float, values)))


@pytest.fixture(scope="module")
def constructed():
    rng = np.random.default_rng(7)
    baseline = rng.uniform(0.2, 0.6, len(QUERIES))
    better = baseline + 0.08 + rng.normal(0, 0.03, len(QUERIES))  # a consistent gain: significant
    noise = np.tile([0.05, -0.05], len(QUERIES) // 2)  # gains and losses that cancel exactly: not significant
    same_mean = baseline + noise + rng.normal(0, 0.001, len(QUERIES))
    return baseline, better, same_mean


def _scipy_p(test: str, a, b) -> float:
    order = np.argsort(QUERIES)  # paired_test orders queries by id (the randomization test's draws depend on order)
    a, b = np.asarray(a)[order], np.asarray(b)[order]
    if test == "t":
        return stats.ttest_rel(a, b).pvalue
    if test == "wilcoxon":
        return stats.wilcoxon(a, b).pvalue
    return stats.permutation_test((a, b), lambda u, v, axis: np.mean(u - v, axis=axis), permutation_type="samples",
                                  vectorized=True, n_resamples=10_000, rng=np.random.default_rng(13)).pvalue


@pytest.mark.parametrize("test", PAIRED_TESTS)
def test_known_significant_case_matches_scipy(test, constructed):
    baseline, better, _ = constructed
    result = paired_test(_per_query(better), _per_query(baseline), test)
    assert result.p_value == pytest.approx(_scipy_p(test, better, baseline), rel=1e-9, abs=1e-12)
    assert result.p_value < 0.05 and significance_level(result.p_value) == 0.05
    assert result.difference == pytest.approx(float(np.mean(better - baseline)))
    assert result.num_queries == len(QUERIES)


@pytest.mark.parametrize("test", PAIRED_TESTS)
def test_known_non_significant_case_matches_scipy(test, constructed):
    baseline, _, same_mean = constructed
    result = paired_test(_per_query(same_mean), _per_query(baseline), test)
    assert result.p_value == pytest.approx(_scipy_p(test, same_mean, baseline), rel=1e-9, abs=1e-12)
    assert result.p_value > 0.10 and significance_level(result.p_value) is None


def test_levels_95_and_90():
    assert significance_level(0.049) == 0.05
    assert significance_level(0.05) == 0.10  # p < level, strictly
    assert significance_level(0.099) == 0.10
    assert significance_level(0.10) is None and significance_level(None) is None


def test_degenerate_inputs_have_limit_p_values_not_nan():
    a = _per_query([0.5] * len(QUERIES))
    for test in PAIRED_TESTS:
        assert paired_test(a, dict(a), test).p_value == 1.0  # identical systems
    shifted = {q: v + 0.1 for q, v in a.items()}
    assert paired_test(shifted, a, "t").p_value == 0.0  # constant non-zero difference: zero variance


def test_different_query_sets_are_refused():
    a = _per_query(range(len(QUERIES)))
    b = dict(a)
    b.pop("q3")
    with pytest.raises(ValueError, match="different queries"):
        paired_test(a, b)


def test_holm_and_bonferroni_against_hand_values():
    p = [0.01, 0.04, 0.03, 0.005]
    # Bonferroni: 4p capped at 1.
    assert adjust_p_values(p, "bonferroni") == pytest.approx([0.04, 0.16, 0.12, 0.02])
    # Holm: sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06.
    assert adjust_p_values(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjust_p_values([0.6, 0.5], "holm") == pytest.approx([1.0, 1.0])
    assert adjust_p_values(p, "none") == p
    with pytest.raises(ValueError, match="unknown correction"):
        adjust_p_values(p, "sidak")


def test_relative_change_in_percent():
    assert relative_change(0.33, 0.30) == pytest.approx(10.0)
    assert relative_change(0.27, 0.30) == pytest.approx(-10.0)
    assert relative_change(0.1, 0.0) is None  # undefined, not infinite


@pytest.mark.parametrize("test", PAIRED_TESTS)
def test_queries_are_paired_by_id_whatever_the_order_of_either_dict(test, constructed):
    baseline, better, _ = constructed
    a = _per_query(better)
    b = dict(reversed(list(_per_query(baseline).items())))  # the same queries, inserted in the other order
    result = paired_test(a, b, test)
    assert result.p_value == pytest.approx(_scipy_p(test, better, baseline), rel=1e-9, abs=1e-12)
    # pairing by position would compare each query with another one: a different answer
    misaligned = _scipy_p(test, better, baseline[::-1])
    assert abs(result.p_value - misaligned) > 1e-3


def test_differences_at_rounding_level_are_no_difference():
    a = _per_query(np.linspace(0.1, 0.9, len(QUERIES)))
    rounded = {q: v + 1e-9 for q, v in a.items()}  # the same measures, summed in another order
    for test in PAIRED_TESTS:
        assert paired_test(rounded, a, test).p_value == 1.0
    noisy = {q: v + (1e-12 if i % 2 else -1e-12) + 0.1 for i, (q, v) in enumerate(a.items())}
    assert paired_test(noisy, a, "t").p_value == 0.0  # a constant 0.1 up to rounding: zero variance


def test_wilcoxon_ranks_differences_rounded_to_the_tolerance():
    """Issue 58 item 5: 1e-12 noise on 40 of 60 queries is no difference (it moved p 0.179 -> 0.240)."""
    rng = np.random.default_rng(0)
    base = {f"q{i}": float(v) for i, v in enumerate(rng.uniform(0, 1, 60))}
    diff = np.r_[rng.normal(0.02, 0.05, 20), np.zeros(40)]
    clean = {q: base[q] + d for q, d in zip(sorted(base), diff)}
    noisy = {q: v + (1e-12 if i >= 20 else 0.0) for i, (q, v) in enumerate(sorted(clean.items()))}
    expected = stats.wilcoxon(diff, zero_method="wilcox").pvalue  # the same zeros dropped
    assert paired_test(noisy, base, "wilcoxon").p_value == pytest.approx(paired_test(clean, base, "wilcoxon").p_value)
    assert paired_test(clean, base, "wilcoxon").p_value == pytest.approx(expected, rel=1e-6)


def test_randomization_resolution_follows_the_family():
    """Issue 58 item 2: with 500 comparisons Bonferroni needs p < 1e-4; 10,000 resamples cannot give it."""
    assert randomization_resamples(1) == 10_000 and randomization_resamples(500) == 200_000
    a = {f"q{i}": 0.5 + 0.1 * (i % 3 + 1) for i in range(50)}
    b = {q: 0.5 for q in a}
    assert paired_test(a, b, "randomization", family_size=500).p_value * 500 < 0.05
    assert paired_test(a, b, "randomization").p_value * 500 >= 0.05  # today's 10,000: 1/10,001 x 500
