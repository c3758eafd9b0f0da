"""Uncertainty of a comparison: seeds' spread, bootstrap intervals, direction and effect size.

A system is compared with its baseline on the same queries (and, when both were trained
with the same seeds, seed by seed). Everything here works on the difference system -
baseline per query (a vector) or per seed and query (a matrix, one row per seed).

- :func:`seed_summary`: the mean over seeds of a system's aggregate, the seeds' standard
  deviation (``ddof=1``: the seeds are a sample of the seeds one could have drawn) and their
  count.
- :func:`bootstrap_interval`: a paired bootstrap 95% interval of the mean difference, from
  ``scipy.stats.bootstrap``. Over queries, or, with several seeds, over queries x seeds: the
  seeds and the queries are resampled independently and the statistic is the mean of the
  chosen seeds' rows at the chosen queries (the "multi-bootstrap" of Sellam et al., ICLR
  2022, paired: system and baseline keep their seed and query). Queries are not independent
  across seeds (the same query is hard for every seed), so pooling the seeds x queries cells
  as if they were independent would give intervals too narrow.

  The **percentile** method, not BCa (scipy's default), because: the statistic is a mean over
  tens to thousands of queries, whose bootstrap distribution is close to symmetric, so BCa's
  bias and skew corrections change the bounds by little; BCa's acceleration is a jackknife
  over each resampled axis, which over 2-3 seeds is an estimate from 2-3 numbers; BCa yields
  NaN on degenerate data, common in IR (P@1 differences of only -1, 0, 1, a system equal to
  its baseline on most queries); and a percentile interval is reproducible by hand from the
  same random draws (tests/workloads/evaluation/test_statistics.py does).
  Seeded (:data:`BOOTSTRAP_SEED`, a fresh generator per interval): an interval does not depend
  on which other intervals were computed before it.
- :func:`t_interval` and :func:`seeds_t_test`: the report's default interval and (with several
  seeds) its default test, one t statistic for both. Seeds are a level of the analysis: the
  difference matrix (seeds x queries, one value per cell) is a two-way crossed random-effects
  layout, the mean's variance is ``(MS_seeds + MS_queries - MS_residual) / (seeds x queries)``
  from its mean squares, with degrees of freedom the harmonic mean of the seeds' (``seeds - 1``)
  and the queries' (``queries - 1``) weighted by their mean squares' shares (Satterthwaite's
  weights squared: too many df with 2-3 seeds); with one seed it is the paired t-test and its
  t interval. Chosen by ``benchmarks/stat_calibration.py`` (a simulation fitted
  to measured per-query differences, numbers in docs/guide/results.md): the test on
  seed-averaged values rejected a true null 11-36% of the time with 3-5 seeds, the seeds x
  queries percentile bootstrap covered 85-92%; with one seed and 43 queries the t interval
  covered 0.959, the percentile bootstrap 0.919. The t needs no resampling (the same digits
  everywhere) and agrees with the t-test's marker by construction.
- :func:`direction`: the queries the system won, tied (within
  :data:`~workloads.evaluation.significance.DIFFERENCE_TOLERANCE`) and lost.
- :func:`effect_size`: the mean difference over its standard deviation across queries
  (paired Cohen's d, "d_z"); undefined (None) when every query differs by the same amount.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
from scipy import stats

from workloads.evaluation import mean_of
from workloads.evaluation.significance import DIFFERENCE_TOLERANCE

CONFIDENCE = 0.95
BOOTSTRAP_METHOD = "percentile"
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 13
# resamples x (seeds +) queries values held at once (scipy's ``batch``): ~128 MiB of float64
BOOTSTRAP_BATCH_VALUES = 2**24


@dataclass(frozen=True)
class SeedSummary:
    """A system's aggregate over its seeds."""

    mean: float
    std: float | None  # None with a single seed
    count: int


@dataclass(frozen=True)
class Interval:
    """A two-sided interval of the mean difference (system - baseline)."""

    low: float
    high: float
    confidence: float
    queries: int
    seeds: int  # 1: over queries only; more: over queries x seeds


@dataclass(frozen=True)
class TStatistic:
    """The mean difference, its standard error and degrees of freedom (seeds and queries)."""

    mean: float
    se: float
    df: float


def t_statistic(differences: np.ndarray) -> TStatistic:
    """The mean of ``differences`` (queries, or seeds x queries) with its standard error and
    degrees of freedom: the paired t's for one row, the crossed random-effects ANOVA's (seeds and
    queries both random, share-weighted degrees of freedom) for several. scipy and statsmodels
    have no crossed two-way random-effects estimate of a mean's variance; it is three mean squares."""
    d = np.atleast_2d(np.asarray(differences, dtype=float))
    d = np.where(np.abs(d) <= DIFFERENCE_TOLERANCE, 0.0, d)  # rounding noise is no difference (as the tests do)
    s, n = d.shape
    if n == 0:
        raise ValueError("no queries to compare")
    grand = float(d.mean())
    if s == 1:
        if n < 2:
            return TStatistic(grand, 0.0, 0.0)
        return TStatistic(grand, float(d[0].std(ddof=1) / math.sqrt(n)), float(n - 1))
    seed_means, query_means = d.mean(axis=1), d.mean(axis=0)
    ms_seeds = n * float(((seed_means - grand) ** 2).sum()) / (s - 1)
    if n < 2:  # one query: only the seeds vary
        return TStatistic(grand, math.sqrt(ms_seeds / s), float(s - 1))
    ms_queries = s * float(((query_means - grand) ** 2).sum()) / (n - 1)
    residual = d - seed_means[:, None] - query_means[None, :] + grand
    ms_residual = float((residual ** 2).sum()) / ((s - 1) * (n - 1))
    combined = ms_seeds + ms_queries - ms_residual
    # Share-weighted degrees of freedom: the harmonic mean of the seeds' and the queries' df,
    # weighted by each mean square's share. Satterthwaite weights by the squared shares and so
    # gives more df exactly when MS_seeds (2-4 df) came out small: it rejected a true null 7.8%
    # of the time at 3 seeds x 300 queries; these df, never more than Satterthwaite's, 5.5%.
    if ms_seeds + ms_queries > 0:
        share = ms_seeds / (ms_seeds + ms_queries)
        df = 1.0 / (share / (s - 1) + (1.0 - share) / (n - 1))
    else:
        df = float(s - 1)
    return TStatistic(grand, math.sqrt(max(combined, ms_residual, 0.0) / (s * n)), max(float(df), 1.0))


def seeds_t_test(differences: np.ndarray) -> float:
    """Two-sided p of the mean difference being 0 (:func:`t_statistic`); degenerate data get
    their limit: all 0 -> 1, a constant non-zero difference -> 0."""
    t = t_statistic(differences)
    if t.se <= 0 or t.df <= 0:
        return 1.0 if abs(t.mean) <= DIFFERENCE_TOLERANCE or t.df <= 0 else 0.0
    return float(2 * stats.t.sf(abs(t.mean) / t.se, t.df))


def t_interval(differences: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The t interval of the mean difference (:func:`t_statistic`) at ``confidence``."""
    d = np.atleast_2d(np.asarray(differences, dtype=float))
    t = t_statistic(d)
    half = 0.0 if t.se <= 0 or t.df <= 0 else float(stats.t.ppf(0.5 + confidence / 2, t.df)) * t.se
    return Interval(t.mean - half, t.mean + half, confidence, d.shape[1], d.shape[0])


@dataclass(frozen=True)
class Direction:
    won: int
    tied: int
    lost: int


def seed_summary(per_seed: dict[str, dict[str, float]]) -> SeedSummary:
    """Seed -> query -> value: the mean over seeds of each seed's mean over queries, their spread."""
    if not per_seed:
        raise ValueError("no seeds")
    # Each seed's mean is the one its cell shows (mean_of, not numpy's pairwise sum); the spread is
    # statistics.stdev's, computed exactly and rounded once: the same digits on every interpreter.
    means = [mean_of(values.values()) if values else 0.0 for values in per_seed.values()]
    std = statistics.stdev(means) if len(means) > 1 else None
    return SeedSummary(mean_of(means), std, len(means))


def difference_matrix(system: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]]) -> np.ndarray:
    """Seed -> query -> value of both sides -> the differences, one row per seed (queries sorted).

    Seeds are paired by name when both sides have the same seeds (a grid trains the baseline
    with every seed); otherwise each side is first averaged over its seeds (one row). Raises
    ValueError when a side's seeds, or the two sides, were scored on different queries.
    """
    queries = None
    for side in (system, baseline):
        for seed, values in side.items():
            if queries is None:
                queries = sorted(values)
            elif sorted(values) != queries:
                raise ValueError(f"seed {seed} was scored on other queries than the rest ({len(values)} vs {len(queries)})")
    if not queries:
        raise ValueError("no queries to compare")

    def rows(side: dict[str, dict[str, float]], seeds) -> np.ndarray:
        return np.array([[side[s][q] for q in queries] for s in seeds], dtype=float)

    if set(system) == set(baseline):
        seeds = sorted(system)
        return rows(system, seeds) - rows(baseline, seeds)
    return rows(system, sorted(system)).mean(axis=0, keepdims=True) - rows(baseline, sorted(baseline)).mean(axis=0, keepdims=True)


def bootstrap_interval(differences: np.ndarray, confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> Interval:
    """Paired bootstrap interval of the mean of ``differences`` (queries, or seeds x queries).

    A vector, or a matrix of one row: queries are resampled. A matrix of several rows: seeds and
    queries are resampled independently (rows, then columns, from one seeded generator).
    """
    d = np.atleast_2d(np.asarray(differences, dtype=float))
    num_seeds, num_queries = d.shape
    if num_queries == 0:
        raise ValueError("no queries to compare")
    rng = np.random.default_rng(seed)
    d = np.where(np.abs(d) <= DIFFERENCE_TOLERANCE, 0.0, d)  # rounding noise is no difference (as the tests do)
    if not d.any():  # identical systems: every resample is 0 (and scipy warns on degenerate data)
        return Interval(0.0, 0.0, confidence, num_queries, num_seeds)
    batch = max(1, BOOTSTRAP_BATCH_VALUES // (num_seeds + num_queries))
    if num_seeds == 1:
        result = stats.bootstrap((d[0],), np.mean, n_resamples=resamples, batch=batch, vectorized=True,
                                 confidence_level=confidence, method=BOOTSTRAP_METHOD, rng=rng)
    else:
        def mean_of_chosen(seed_index, query_index, axis=-1):
            # the mean of d[s][:, q] as counts: how often each seed and query was drawn (no seeds x queries copy)
            s = np.atleast_2d(np.asarray(seed_index, dtype=np.intp))
            q = np.atleast_2d(np.asarray(query_index, dtype=np.intp))
            return np.einsum("bs,sq,bq->b", _counts(s, num_seeds), d, _counts(q, num_queries)) / (num_seeds * num_queries)

        result = stats.bootstrap((np.arange(num_seeds), np.arange(num_queries)), mean_of_chosen, n_resamples=resamples,
                                 batch=batch, vectorized=True, paired=False, confidence_level=confidence,
                                 method=BOOTSTRAP_METHOD, rng=rng)
    low, high = (float(x) for x in result.confidence_interval)
    return Interval(low, high, confidence, num_queries, num_seeds)


def _counts(indices: np.ndarray, size: int) -> np.ndarray:
    """Per row of ``indices`` (resamples x draws), how often each of ``size`` items was drawn."""
    offsets = indices + size * np.arange(len(indices))[:, None]
    return np.bincount(offsets.ravel(), minlength=len(indices) * size).reshape(len(indices), size).astype(float)


def direction(differences: np.ndarray) -> Direction:
    """Queries won / tied / lost by the system, on the per-query differences (averaged over seeds)."""
    d = np.asarray(differences, dtype=float)
    if d.ndim == 2:
        d = d.mean(axis=0)
    return Direction(int((d > DIFFERENCE_TOLERANCE).sum()), int((np.abs(d) <= DIFFERENCE_TOLERANCE).sum()),
                     int((d < -DIFFERENCE_TOLERANCE).sum()))


def effect_size(differences: np.ndarray) -> float | None:
    """Mean per-query difference over its standard deviation (``ddof=1``; seeds averaged first).

    None when undefined: fewer than two queries, or no spread (every query differs by the same
    amount, 0 included)."""
    d = np.asarray(differences, dtype=float)
    if d.ndim == 2:
        d = d.mean(axis=0)
    d = np.where(np.abs(d) <= DIFFERENCE_TOLERANCE, 0.0, d)
    if len(d) < 2:
        return None
    spread = float(np.std(d, ddof=1))
    if spread <= DIFFERENCE_TOLERANCE or math.isnan(spread):
        return None
    return float(d.mean() / spread)


@dataclass(frozen=True)
class Uncertainty:
    """A comparison's difference with its interval, direction and effect size."""

    difference: float
    interval: Interval | None
    direction: Direction
    effect: float | None


def compare_uncertainty(system: dict[str, dict[str, float]], baseline: dict[str, dict[str, float]],
                        interval: bool = True, confidence: float = CONFIDENCE) -> Uncertainty:
    """Seed -> query -> value of a system and its baseline: the mean difference, its t interval
    (:func:`t_interval`, at ``confidence``, when ``interval``), the queries won/tied/lost and the
    effect size."""
    d = difference_matrix(system, baseline)
    return Uncertainty(float(d.mean()), t_interval(d, confidence) if interval else None, direction(d), effect_size(d))
