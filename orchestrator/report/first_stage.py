"""Each system against the first stage it re-ranks, when its final ranking fuses the two.

A sweep whose winners are tested fused with the first stage (``reranking.interpolation``)
has three numbers per system that a reader needs side by side: the fused ranking, the
cross-encoder alone, and the first stage (BM25) on the same queries. The grid table shows
the first of them against the system's baseline; this block shows all three with the fused
ranking's difference from the first stage and its 95% t interval (over the queries with one
seed, over seeds and queries with several: :func:`workloads.evaluation.statistics.t_interval`),
each system's difference from its baseline with the same interval, and a sentence that says
what won, by how much, with what confidence.

The intervals are each at 95%, not corrected for the block's comparisons (the grid table's
``--correction`` is for claims over many cells); the block says so.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from orchestrator.core import schema
from orchestrator.report.results import STATUS_OK, SYSTEM_AXES, SweepResults, SystemResult, baseline_of, systems
from orchestrator.report.tables import first_stage_title
from workloads.evaluation import DISPLAY_NAMES, mean_of
from workloads.evaluation.statistics import SeedSummary, Uncertainty, compare_uncertainty, seed_summary


@dataclass(frozen=True)
class SystemAgainstFirstStage:
    label: str
    system: SystemResult
    fused: SeedSummary
    alone: SeedSummary | None          # the cross-encoder alone (None when a seed lacks it)
    weight: float | None               # the cross-encoder's weight in the fusion, mean over seeds
    against_first_stage: Uncertainty   # fused - first stage
    against_baseline: Uncertainty | None  # fused - its baseline's fused (None for a baseline)


@dataclass(frozen=True)
class FirstStageComparison:
    first_stage: str   # its label, "BM25"
    first_stage_value: float
    queries: int
    rows: list[SystemAgainstFirstStage]


def _labels(finished: list[SystemResult]) -> dict[str, str]:
    """Short names in the grid table's words: ``baseline``, ``bm25 / pointwise+scl``, prefixed by
    the model and size where the sweep has several."""
    varying = [a for a in ("model", "size") if len({s.axes[a] for s in finished}) > 1]
    out = {}
    for s in finished:
        own = "baseline" if s.is_baseline else f"{s.axes['augmentation']} / {s.axes['loss']}"
        out[s.label] = " / ".join([*(s.axes[a] for a in varying), own])
    return out


def compare_with_first_stage(results: SweepResults, prefix: str, metric: str) -> FirstStageComparison | None:
    """The comparison on ``prefix``'s queries, or None when no finished system's final ranking
    is fused (its cross-encoder alone was not evaluated apart) or the first stage has no values."""
    evaluation = results.first_stage(prefix)
    if evaluation is None or not evaluation.values.get(metric):
        return None
    first_stage = evaluation.values[metric]
    fused = [s for s in systems(results, metric, prefix) if s.status == STATUS_OK]
    alone = {s.label: s for s in systems(results, metric, f"{prefix}cross_encoder_") if s.status == STATUS_OK}
    if not fused or not any(s.label in alone for s in fused):
        return None
    labels = _labels(fused)
    rows = []
    for system in fused:
        by_seed = system.per_seed or {"": system.per_query}
        baseline = None if system.is_baseline else baseline_of(system, fused)
        weights = [c.run.data.metrics.get(schema.weight_metric(prefix.removesuffix("_"))) for c in system.cells if c.run is not None]
        rows.append(SystemAgainstFirstStage(
            labels[system.label], system, seed_summary(by_seed),
            seed_summary(alone[system.label].per_seed or {"": alone[system.label].per_query}) if system.label in alone else None,
            mean_of(weights) if weights and None not in weights else None,
            compare_uncertainty(by_seed, {seed: first_stage for seed in by_seed}),
            compare_uncertainty(by_seed, baseline.per_seed or {"": baseline.per_query}) if baseline is not None else None))
    return FirstStageComparison(results.first_stage_label(prefix), mean_of(first_stage.values()), len(first_stage), rows)


def _value(summary: SeedSummary | None, digits: int) -> str:
    if summary is None:
        return "-"
    return f"{summary.mean:.{digits}f}" + (f" ± {summary.std:.{digits}f}" if summary.std is not None else "")


def _difference(u: Uncertainty | None, digits: int) -> str:
    if u is None:
        return ""
    return f"{u.difference:+.{digits}f} [{u.interval.low:+.{digits}f}, {u.interval.high:+.{digits}f}]"


def _excludes_zero(u: Uncertainty) -> int:
    """+1 when the interval lies above zero, -1 below, 0 when it holds zero."""
    return 1 if u.interval.low > 0 else -1 if u.interval.high < 0 else 0


def summary_sentence(comparison: FirstStageComparison, metric: str, digits: int = 4) -> str:
    """What won, by how much, with what confidence: for a reader new to the sweep."""
    name, rows, fs = DISPLAY_NAMES.get(metric, metric), comparison.rows, comparison.first_stage
    best = max(rows, key=lambda r: r.fused.mean)
    above = [r for r in rows if _excludes_zero(r.against_first_stage) > 0]
    below = [r for r in rows if _excludes_zero(r.against_first_stage) < 0]
    u = best.against_first_stage
    over = f"{u.interval.seeds} seed{'s' if u.interval.seeds > 1 else ''} x {u.interval.queries} queries"
    sentences = [
        f"Fused with {fs}, {len(above)} of {len(rows)} systems {'ranks' if len(above) == 1 else 'rank'} better than {fs} alone "
        f"({name} {comparison.first_stage_value:.{digits}f}) with a 95% interval above zero"
        + (f" ({len(below)} below it)" if below else "")
        + f"; the highest, {best.label}, reaches {best.fused.mean:.{digits}f}: {u.difference:+.{digits}f} "
        f"[{u.interval.low:+.{digits}f}, {u.interval.high:+.{digits}f}] over {over}."]
    alone = [r.alone.mean for r in rows if r.alone is not None]
    if alone:
        span = f"{min(alone):.{digits}f}" if len(alone) == 1 else f"{min(alone):.{digits}f}-{max(alone):.{digits}f}"
        where = ("below" if max(alone) < comparison.first_stage_value else
                 "above" if min(alone) > comparison.first_stage_value else "around")
        gain = (f": the gain comes from fusing its scores with {fs}'s." if above else
                f", and fusing its scores with {fs}'s did not lift any system clearly above {fs}.")
        sentences.append(f"The cross-encoder alone reaches {span}, {where} {fs}" + (gain if where == "below" else "."))
    compared = [r for r in rows if r.against_baseline is not None]
    if compared:
        parts = ", ".join(f"{r.label} {_difference(r.against_baseline, digits)}" for r in compared)
        clear = [r for r in compared if _excludes_zero(r.against_baseline) != 0]
        signs = {_excludes_zero(r.against_baseline) for r in clear}
        if not clear:
            verdict = "no interval excludes zero: on these queries and seeds no system is shown to differ from its baseline"
        elif len(clear) == len(compared) and len(signs) == 1:
            side = "above" if signs == {1} else "below"
            count = {1: "the interval lies", 2: "both intervals lie"}.get(len(clear), f"all {len(clear)} intervals lie")
            verdict = (f"{count} {side} zero: "
                       f"{'better' if side == 'above' else 'worse'} than the baseline on these queries and seeds")
        else:
            verdict = (f"{len(clear)} of {len(compared)} intervals exclude zero ("
                       + ", ".join(f"{r.label} {'above' if _excludes_zero(r.against_baseline) > 0 else 'below'}" for r in clear) + ")")
        sentences.append(f"Against the baseline (fused too): {parts}; {verdict}.")
    return " ".join(sentences)


def render_first_stage_markdown(comparison: FirstStageComparison, metric: str, label: str, digits: int = 4) -> str:
    name = DISPLAY_NAMES.get(metric, metric)
    fs = comparison.first_stage
    seeds = max(r.fused.count for r in comparison.rows)
    lines = [f"Against the first stage: {name} on {label} ({comparison.queries} queries), each system fused with {fs} "
             f"and alone", "",
             f"| system | fused with {fs} | fused - {fs} [95% interval] | cross-encoder alone | weight | fused - baseline [95% interval] |",
             "|:---|---:|---:|---:|---:|---:|",
             f"| {first_stage_title(fs)} | {comparison.first_stage_value:.{digits}f} | | | | |"]
    for r in comparison.rows:
        weight = f"{r.weight:.2f}" if r.weight is not None else "-"
        versus = ("" if r.system.is_baseline else "no baseline") if r.against_baseline is None else _difference(r.against_baseline, digits)
        lines.append(f"| {r.label} | {_value(r.fused, digits)} | {_difference(r.against_first_stage, digits)} | "
                     f"{_value(r.alone, digits)} | {weight} | {versus} |")
    spread = (f"mean over {seeds} seeds ± the seeds' standard deviation; intervals: t over seeds x queries"
              if seeds > 1 else "one seed; intervals: paired t over the queries")
    compared = len(comparison.rows) + sum(r.against_baseline is not None for r in comparison.rows)
    lines += ["", f"Each value: {spread}, each at 95%, not corrected for the block's {compared} "
                  f"comparisons. Weight: the cross-encoder's share of the fused score, chosen on validation.", "",
              summary_sentence(comparison, metric, digits), ""]
    return "\n".join(lines)


def render_first_stage_csv(comparison: FirstStageComparison) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["system", *SYSTEM_AXES, "seeds", "fused", "fused_seed_std", "cross_encoder", "cross_encoder_seed_std",
                     "weight", "difference", "ci_low", "ci_high", "won", "tied", "lost",
                     "baseline_difference", "baseline_ci_low", "baseline_ci_high"])
    writer.writerow([first_stage_title(comparison.first_stage), *[""] * len(SYSTEM_AXES), "", repr(comparison.first_stage_value),
                     *[""] * 13])

    def number(value) -> str:
        return "" if value is None else repr(float(value))

    for r in comparison.rows:
        u, b = r.against_first_stage, r.against_baseline
        writer.writerow([r.label, *(r.system.axes[a] for a in SYSTEM_AXES), r.fused.count, number(r.fused.mean),
                         number(r.fused.std), number(r.alone and r.alone.mean), number(r.alone and r.alone.std),
                         number(r.weight), number(u.difference), number(u.interval.low), number(u.interval.high),
                         u.direction.won, u.direction.tied, u.direction.lost,
                         number(b and b.difference), number(b and b.interval.low), number(b and b.interval.high)])
    return buffer.getvalue()
