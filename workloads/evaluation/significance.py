"""Paired per-query significance tests and multiple-comparison corrections.

Systems are compared on the same queries: a paired test on the per-query values of one
measure. The tests are scipy's; a result is marked significant at 95% (p < 0.05) and at
90% (p < 0.10).

- ``t``: paired two-sided t-test (``scipy.stats.ttest_rel``), the default, as in AUG.
- ``wilcoxon``: Wilcoxon signed-rank test (``scipy.stats.wilcoxon``) on the differences
  rounded to 0 within :data:`DIFFERENCE_TOLERANCE` (the tolerance won / tied / lost use), zero
  differences dropped as in Wilcoxon's original test.
- ``randomization``: Fisher's paired randomization (sign-flip permutation) test of the
  mean difference (``scipy.stats.permutation_test``, seeded), as recommended for IR by
  Smucker, Allan and Carterette (CIKM 2007). Its resolution follows the family
  (:func:`randomization_resamples`): at least 10,000 resamples and 20 per corrected threshold
  (``20 m / 0.05``), so that a Bonferroni/Holm-corrected p of a family of ``m`` can fall under
  0.05; beyond :data:`MAX_RANDOMIZATION_RESAMPLES` the sign-flip distribution's normal
  approximation (its mean 0, variance the sum of squared differences) gives the p.

Multiple comparisons (:func:`adjust_p_values`): Holm (1979) and Bonferroni control the
family-wise error rate, Benjamini-Hochberg (1995) the false discovery rate
(``scipy.stats.false_discovery_control``). Holm and Bonferroni are written here, not taken
from statsmodels' ``multipletests``: scipy has neither, each is a few lines, and statsmodels
(with patsy) would be a dependency of every Ray worker for them; they are tested against the
published worked example of Benjamini and Hochberg (1995), as BH is
(tests/workloads/evaluation/test_statistics.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

PairedTest = Literal["t", "wilcoxon", "randomization"]
Correction = Literal["none", "holm", "bonferroni", "bh"]
PAIRED_TESTS: tuple[str, ...] = ("t", "wilcoxon", "randomization")
CORRECTIONS: tuple[str, ...] = ("none", "holm", "bonferroni", "bh")
CORRECTION_NAMES = {"none": "not corrected", "holm": "Holm", "bonferroni": "Bonferroni",
                    "bh": "Benjamini-Hochberg (false discovery rate)"}
TEST_NAMES = {"t": "paired two-sided t-test", "wilcoxon": "two-sided Wilcoxon signed-rank test",
              "randomization": "two-sided Fisher's paired randomization test (10,000 permutations, more in a large family)"}
LEVELS = (0.05, 0.10)  # 95% and 90%
RANDOMIZATION_RESAMPLES = 10_000  # the least: a family of one
MAX_RANDOMIZATION_RESAMPLES = 200_000  # more: the normal approximation (queries x resamples values held)
# per-query values closer than this are equal: measures lie in [0, 1] and rounding differs by far less
DIFFERENCE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class PairedComparison:
    """System ``a`` against system ``b`` on the queries they share."""

    mean_a: float
    mean_b: float
    p_value: float
    num_queries: int

    @property
    def difference(self) -> float:
        return self.mean_a - self.mean_b


def paired_values(a: dict[str, float], b: dict[str, float]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The shared query ids (sorted) and both systems' values on them.

    Raises ValueError when the query sets differ: a comparison on different queries is not
    paired, and silently intersecting would hide a broken evaluation.
    """
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise ValueError(f"the two systems were scored on different queries ({len(only_a)} only in the first, "
                         f"{len(only_b)} only in the second, e.g. {(only_a or only_b)[:3]})")
    qids = sorted(a)
    return qids, np.array([a[q] for q in qids], dtype=float), np.array([b[q] for q in qids], dtype=float)


def randomization_resamples(family_size: int = 1, alpha: float = LEVELS[0]) -> int:
    """Resamples a randomization test needs in a family of ``family_size`` corrected by
    Holm/Bonferroni: 20 per corrected threshold ``alpha / m`` (its smallest p is 1 / (B + 1))."""
    return max(RANDOMIZATION_RESAMPLES, math.ceil(20 * max(family_size, 1) / alpha))


def smallest_p(test: str, num_queries: int, family_size: int = 1) -> float:
    """The smallest p-value ``test`` can give on ``num_queries`` queries (0: none binds)."""
    if test == "randomization":
        resamples = randomization_resamples(family_size)
        if resamples > MAX_RANDOMIZATION_RESAMPLES:
            return 0.0
        return max(1.0 / (resamples + 1), 2.0 ** (1 - num_queries))  # exact when every sign flip is drawn
    if test == "wilcoxon" and num_queries <= 50:  # scipy's exact distribution: all same-signed ranks
        return 2.0 ** (1 - num_queries)
    return 0.0


def paired_test(a: dict[str, float], b: dict[str, float], test: PairedTest = "t", seed: int = 13,
                family_size: int = 1) -> PairedComparison:
    """Two-sided p-value of the paired ``test`` between per-query values ``a`` and ``b``
    (``family_size``: the comparisons corrected together; the randomization test's resolution).

    Degenerate inputs get the p-value of their limit instead of scipy's NaN: identical
    systems (every difference 0) have p = 1; a constant non-zero difference over two or more
    queries has p = 0 for the t-test (zero variance). Differences within
    :data:`DIFFERENCE_TOLERANCE` count as 0: per-query measures recomputed in another order
    differ by rounding (1e-16 .. 1e-9), which is no difference between systems.
    """
    if test not in PAIRED_TESTS:
        raise ValueError(f"unknown test '{test}' (choose from {', '.join(PAIRED_TESTS)})")
    _, x, y = paired_values(a, b)
    n = len(x)
    if n == 0:
        raise ValueError("no queries to compare")
    diff = np.where(np.abs(x - y) <= DIFFERENCE_TOLERANCE, 0.0, x - y)
    if not diff.any():
        p = 1.0
    elif test == "t":
        if n < 2:
            p = 1.0
        elif np.ptp(diff) <= DIFFERENCE_TOLERANCE:
            p = 0.0
        else:
            p = float(stats.ttest_rel(x, y).pvalue)
    elif test == "wilcoxon":
        p = float(stats.wilcoxon(diff, zero_method="wilcox").pvalue)
    elif randomization_resamples(family_size) > MAX_RANDOMIZATION_RESAMPLES:
        # the sign-flip statistic sum(d * sign) has mean 0 and variance sum(d^2) (scipy has no such test)
        p = float(2 * stats.norm.sf(abs(diff.sum()) / math.sqrt(float((diff ** 2).sum()))))
    else:
        result = stats.permutation_test(
            (x, y), lambda u, v, axis: np.mean(u - v, axis=axis), permutation_type="samples",
            vectorized=True, n_resamples=randomization_resamples(family_size), alternative="two-sided",
            rng=np.random.default_rng(seed))
        p = float(result.pvalue)
    return PairedComparison(float(x.mean()), float(y.mean()), p, n)


def adjust_p_values(p_values: list[float], correction: Correction = "none") -> list[float]:
    """Corrected p-values of one family of comparisons, in input order.

    Holm (1979): sort ascending, multiply the i-th smallest (0-based) by m - i, take the
    running maximum, cap at 1. Bonferroni: m * p, capped at 1. BH: Benjamini-Hochberg's
    adjusted p-values (``scipy.stats.false_discovery_control``): a comparison with adjusted
    p < q is a discovery at false discovery rate q.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown correction '{correction}' (choose from {', '.join(CORRECTIONS)})")
    m = len(p_values)
    if correction == "none" or m == 0:
        return list(p_values)
    if correction == "bonferroni":
        return [min(1.0, p * m) for p in p_values]
    if correction == "bh":
        return [float(p) for p in stats.false_discovery_control(np.asarray(p_values, dtype=float), method="bh")]
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def significance_level(p_value: float | None) -> float | None:
    """The strictest level of LEVELS the p-value passes (0.05 or 0.10), else None."""
    if p_value is None or math.isnan(p_value):
        return None
    return next((level for level in LEVELS if p_value < level), None)


def relative_change(value: float, baseline: float) -> float | None:
    """Relative change in percent; None when the baseline is 0 (undefined, not infinite)."""
    if baseline == 0:
        return None
    return 100.0 * (value - baseline) / baseline
