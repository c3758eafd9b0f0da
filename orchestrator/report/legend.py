"""The lines beneath a table that say what its markers and intervals mean.

One story per cell: a cell's marker and its interval come from the same family. With Holm or
Bonferroni the interval's level is Bonferroni's, ``1 - 0.05 / m`` (a Holm marker can sit beside
such an interval that holds 0: Holm is the more powerful of the two; Bonferroni's agree with
it exactly under the t-test); with BH or no correction the interval is the unadjusted 95% one
(BH bounds the share of false discoveries, not each interval), and the legend says so.
"""

from __future__ import annotations

from workloads.evaluation.significance import (
    CORRECTION_NAMES,
    LEVELS,
    MAX_RANDOMIZATION_RESAMPLES,
    TEST_NAMES,
    randomization_resamples,
    smallest_p,
)
from workloads.evaluation.statistics import CONFIDENCE

ALPHA = LEVELS[0]


def interval_confidence(correction: str, family_size: int) -> float:
    """The interval's level for a family: Bonferroni's for Holm / Bonferroni, else 95%."""
    if correction in ("holm", "bonferroni") and family_size > 1:
        return 1 - ALPHA / family_size
    return CONFIDENCE


def test_name(test: str, family_size: int = 1) -> str:
    """The test as the legend names it (the randomization test with the resamples it drew)."""
    if test != "randomization":
        return TEST_NAMES[test]
    resamples = randomization_resamples(family_size)
    if resamples > MAX_RANDOMIZATION_RESAMPLES:
        return "two-sided paired randomization (sign-flip) test, its normal approximation"
    return f"two-sided Fisher's paired randomization test ({resamples:,} permutations)"


def _level(confidence: float) -> str:
    return f"{100 * confidence:.4g}%"


def unreachable(test: str, correction: str, family_size: int, num_queries: int | None) -> str | None:
    """A warning when no comparison of the family can be marked: the test's smallest p, times the
    family's size under Holm / Bonferroni, is at least 0.05."""
    if correction not in ("holm", "bonferroni") or not num_queries or family_size < 1:
        return None
    floor = smallest_p(test, num_queries, family_size) * family_size
    if floor < ALPHA:
        return None
    return (f"Warning: no comparison can be marked †: on {num_queries} queries the {test} test's smallest p-value, "
            f"{CORRECTION_NAMES[correction]}-corrected over {family_size} comparisons, is {min(floor, 1.0):.3g}.")


def uncertainty_notes(test: str, correction: str, family_line: str | None, ci: bool, family_size: int,
                      entries, compared: bool = True) -> list[str]:
    """The notes of the options (the family, the interval, the seeds) and what the markers mean."""
    entries = [e for e in entries if e.value is not None]
    notes = [family_line] if compared and family_line else []
    seeds = sorted({e.seeds for e in entries})
    several = bool(seeds) and seeds[-1] > 1
    num_queries = next((e.direction.won + e.direction.tied + e.direction.lost for e in entries if e.direction), None)
    confidence = interval_confidence(correction, family_size)
    if compared and ci:
        level = _level(confidence)
        if confidence != CONFIDENCE:
            whose = f"{level} (Bonferroni's level over the family's {family_size} comparisons, as the markers are corrected)"
        elif correction == "bh":
            whose = f"{level} (not adjusted: Benjamini-Hochberg's markers bound false discoveries, not intervals)"
        else:
            whose = level
        over = ("seeds and queries both random (crossed random-effects variance, share-weighted degrees of freedom)"
                if several else "the queries (the paired t-test's)")
        notes.append(f"[low, high]: {whose} t interval of the difference against the baseline, over {over}; "
                     "won / tied / lost: queries better / equal / worse than the baseline; effect: mean difference / "
                     "its standard deviation.")
    if several:
        tested = ("the t-test treats seeds and queries as random (a retrain's variance is in its p)" if test == "t"
                  else f"the {test} test pairs the per-query means over seeds (a retrain's variance is not in its p)")
        notes.append("± the standard deviation over a cell's seeds (" + ", ".join(str(n) for n in seeds) + " seeds); "
                     "the value is their mean" + (f"; {tested}." if compared else "."))
    if compared and entries and seeds == [1]:
        notes.append("One training run (seed) per cell: a marker says this run differs from its baseline's run on these "
                     "queries, not that a retrain would (train with several seeds for that).")
    warning = unreachable(test, correction, family_size, num_queries) if compared else None
    if warning:
        notes.append(warning)
    return notes
