"""Robustness to query perturbations (CFT Table 5; docs/guide/robustness.md).

Each system (a trial run of ``orchestrate run``, or a sweep's cell winners) was tested on
the clean test queries (``test_*``) and on each perturbed copy (``robust_<perturbation>_*``,
only the queries that have a variant). A perturbed set is compared with the clean set **on
the queries both contain** (the contraction set is a subset), by a paired test on the
per-query values; systems (losses) are compared with the first row on each set, paired on
that set's queries.

A row is a system, not a run: a sweep cell trained with several seeds is one row whose
per-query values are the mean over its seeds (as the grid table averages them), so every
test pairs one value per query and system; the table says how many seeds each row holds,
and each entry the seeds' standard deviation (``±``).

The grid table's options apply (docs/guide/results.md): ``correction`` over the table's
perturbed-vs-clean comparisons (every system, perturbation and measure: the table is the
sweep's whole family, so ``family`` sweep and table are one), ``ci`` for the t
interval of each perturbed-minus-clean difference (over queries x seeds, seed by seed), its
queries won / tied / lost and effect size, ``show_seeds`` for each seed's value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.config import load_trials
from orchestrator.lifecycle.identity import trial_key
from orchestrator.report.results import STATUS_OK, RunReader
from orchestrator.report.tables import Entry, Table, TableOptions, family_note
from workloads.core.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, mean_of
from workloads.evaluation.significance import (
    CORRECTION_NAMES,
    TEST_NAMES,
    adjust_p_values,
    paired_test,
    relative_change,
    significance_level,
)
from workloads.evaluation.statistics import compare_uncertainty, seed_summary
from workloads.kinds.rerank.spec import TrialSpec

ROBUSTNESS_METRICS = ("ap", "p_at_1")  # CFT reports MAP and P@1
CLEAN = "clean"


@dataclass(frozen=True)
class PerturbedMeasure:
    """One system, one perturbation, one measure: perturbed vs clean on the shared queries."""

    perturbation: str
    metric: str
    perturbed: float
    clean_on_same_queries: float
    p_value: float
    queries: int
    uncertainty: object | None = None  # workloads.evaluation.statistics.Uncertainty (perturbed - clean, seed by seed)

    @property
    def drop(self) -> float:
        return self.perturbed - self.clean_on_same_queries


def _mean_over_runs(per_run: list[dict[str, dict[str, float]]], label: str) -> dict[str, dict[str, float]]:
    """Metric -> query -> the mean over runs (seeds); runs must have scored the same queries."""
    if len(per_run) == 1:
        return per_run[0]
    out = {}
    for metric in per_run[0]:
        queries = set(per_run[0][metric])
        if any(set(values.get(metric, {})) != queries for values in per_run[1:]):
            raise InputError(label, f"its seeds were scored on different {metric} queries: they cannot be averaged per query")
        out[metric] = {q: mean_of(values[metric][q] for values in per_run) for q in sorted(queries)}
    return out


def _per_run(reader: RunReader, runs, target: str) -> list[dict[str, dict[str, float]]] | None:
    """Each run's (seed's) metric -> query -> value on ``target``; None when a run lacks them."""
    runs = runs if isinstance(runs, (list, tuple)) else [runs]
    evaluations = [reader.per_query(run, schema.target_prefix(target)) if run is not None else None for run in runs]
    return None if not evaluations or any(e is None for e in evaluations) else [e.values for e in evaluations]


def _per_query(reader: RunReader, runs, target: str, label: str = "") -> dict[str, dict[str, float]] | None:
    """The per-query values of ``target`` for one run, or the mean over several (a system's seeds);
    None when a run lacks them."""
    runs = runs if isinstance(runs, (list, tuple)) else [runs]
    per_run = []
    for run in runs:
        evaluation = reader.per_query(run, schema.target_prefix(target)) if run is not None else None
        if evaluation is None:
            return None
        per_run.append(evaluation.values)
    return _mean_over_runs(per_run, label) if per_run else None


def perturbed_vs_clean(reader: RunReader, runs, perturbations: list[str], metrics=ROBUSTNESS_METRICS,
                       test: str = "t", label: str = "", ci: bool = False) -> list[PerturbedMeasure]:
    """Every perturbation x measure of one system (a run, or its seeds' runs: per-query means),
    those it was evaluated on; with ``ci`` the t interval of each difference too."""
    clean = _per_query(reader, runs, schema.TEST, label)
    out = []
    if clean is None:
        return out
    clean_runs = _per_run(reader, runs, schema.TEST)
    for perturbation in perturbations:
        perturbed = _per_query(reader, runs, schema.perturbed_target(perturbation), label)
        if perturbed is None:
            continue
        perturbed_runs = _per_run(reader, runs, schema.perturbed_target(perturbation))
        for metric in metrics:
            values = perturbed[metric]
            same = {q: clean[metric][q] for q in values}
            comparison = paired_test(values, same, test)
            # seed by seed: each seed's perturbed values against its own clean values on the same queries
            by_seed = {str(i): run[metric] for i, run in enumerate(perturbed_runs)}
            clean_by_seed = {str(i): {q: run[metric][q] for q in values} for i, run in enumerate(clean_runs)}
            out.append(PerturbedMeasure(perturbation, metric, comparison.mean_a, comparison.mean_b, comparison.p_value,
                                        comparison.num_queries, compare_uncertainty(by_seed, clean_by_seed, interval=ci)))
    return out


def _seed_fields(per_run: list[dict[str, dict[str, float]]] | None, metric: str) -> dict:
    """A column's seeds (its runs, in order): their count, standard deviation (several) and values."""
    if not per_run:
        return {}
    by_seed = {str(i): run[metric] for i, run in enumerate(per_run)}
    summary = seed_summary(by_seed)
    return {"seeds": summary.count, "seed_std": summary.std,
            "per_seed": tuple((seed, mean_of(v.values())) for seed, v in by_seed.items())}


def _system_row(reader: RunReader, runs, label: str, perturbations: list[str], metrics, test: str, ci: bool = False):
    """One system's entries (clean, then each perturbation, per measure) and its per-query values by column."""
    clean = _per_query(reader, runs, schema.TEST, label) if runs is not None else None
    measured = ({(m.perturbation, m.metric): m for m in perturbed_vs_clean(reader, runs, perturbations, metrics, test, label, ci)}
                if clean else {})
    entries, mine = [], {}
    for name in [CLEAN, *perturbations]:
        target = schema.TEST if name == CLEAN else schema.perturbed_target(name)
        per_query = clean if name == CLEAN else (_per_query(reader, runs, target, label) if clean else None)
        per_run = _per_run(reader, runs, target) if per_query is not None else None
        for metric in metrics:
            column = f"{name} {DISPLAY_NAMES[metric]}"
            if per_query is None:
                entries.append(Entry(None, "missing"))
                continue
            mine[column] = per_query[metric]
            value = mean_of(per_query[metric].values())
            seeds = _seed_fields(per_run, metric)
            if name == CLEAN:
                entries.append(Entry(value, **seeds))
            else:
                m = measured[(name, metric)]
                u = m.uncertainty
                interval = (u.interval.low, u.interval.high) if u is not None and u.interval is not None else None
                entries.append(Entry(value, relative=relative_change(m.perturbed, m.clean_on_same_queries),
                                     p_value=m.p_value, level=significance_level(m.p_value), raw_p_value=m.p_value,
                                     difference=m.drop, ci=interval, direction=u.direction if u else None,
                                     effect=u.effect if u else None, **seeds))
    return entries, mine


def _against_the_first_row(labels: list[str], values: dict, columns: list[str], test: str, ci: bool = False) -> list[str]:
    """A note per system after the first: its paired difference and p-value on every column
    (with ``ci``: the difference's t interval over queries, and queries won / tied / lost)."""
    notes = []
    for label in labels[1:]:
        parts = []
        for column in columns:
            a, b = values[label].get(column), values[labels[0]].get(column)
            if a is None or b is None:
                continue
            comparison = paired_test(a, b, test)
            extra = ""
            if ci:
                u = compare_uncertainty({"": a}, {"": b})
                extra = (f" [{u.interval.low:+.4f}, {u.interval.high:+.4f}], won / tied / lost "
                         f"{u.direction.won} / {u.direction.tied} / {u.direction.lost}")
            parts.append(f"{column} {comparison.difference:+.4f}{extra} (p = {comparison.p_value:.3g})")
        if parts:
            notes.append(f"{label} vs {labels[0]}: " + "; ".join(parts) + ".")
    return notes


def robustness_table(reader: RunReader, systems: list[tuple[str, object]], perturbations: list[str], title: str,
                     test: str = "t", metrics=ROBUSTNESS_METRICS, correction: str = "none", family: str | None = None,
                     ci: bool = False, show_seeds: bool = False) -> Table:
    """Rows: systems (label, its MLflow run or the runs of its seeds); columns: clean and each
    perturbation, per measure.

    A perturbed entry shows its value, its change against the clean value **on the same
    queries** in percent, and ``†``/``°`` when that change is significant (95%/90%). The notes
    give each system against the first row on every column (paired, same queries). A system
    of several seeds is one row: per-query means over its seeds. ``correction`` corrects the
    perturbed-vs-clean p-values over the table (the notes' comparisons with the first row are
    not corrected); ``ci`` and ``show_seeds`` (each seed's value) as for the grid table."""
    sets = [CLEAN, *perturbations]
    columns = [f"{name} {DISPLAY_NAMES[m]}" for name in sets for m in metrics]
    values: dict[str, dict[str, dict[str, float]]] = {}  # label -> column -> per-query values
    rows = []
    seeds = {}
    for label, runs in systems:
        if label in values:
            raise InputError(title, f"two rows are labelled '{label}': a row is one system (its seeds are averaged)")
        seeds[label] = len(runs) if isinstance(runs, (list, tuple)) else 1
        entries, values[label] = _system_row(reader, runs, label, perturbations, metrics, test, ci)
        rows.append(([label], entries))
    tested = [(r, i) for r, (_, entries) in enumerate(rows) for i, e in enumerate(entries) if e.p_value is not None]
    if correction != "none":
        for (r, i), p in zip(tested, adjust_p_values([rows[r][1][i].p_value for r, i in tested], correction)):
            rows[r][1][i] = replace(rows[r][1][i], p_value=p, level=significance_level(p))
    method = CORRECTION_NAMES[correction].split(" (")[0]
    corrected = "" if correction == "none" else f", {method}-corrected over {len(tested)} comparisons"
    notes = [f"Perturbed columns: the change against the clean value on the same queries (the contraction set is a "
             f"subset); † p < 0.05, ° p < 0.10 ({TEST_NAMES[test]}, perturbed vs clean{corrected})."]
    if any(n > 1 for n in seeds.values()):
        notes.append("A row with several seeds shows per-query means over its seeds (every test pairs those means): "
                     + ", ".join(f"{label} {n}" for label, n in seeds.items()) + " seed(s).")
    if family is not None or correction != "none" or ci:
        notes.append(family_note(TableOptions(correction=correction), len(tested), None,
                                 scope="this table, the whole family whichever --family (every system, perturbation and "
                                       "measure: each perturbed set against the clean queries; the comparisons with the "
                                       "first row below are not corrected)"))
    if ci:
        notes.append("[low, high]: 95% t interval of the perturbed-minus-clean difference (over the queries; with several "
                     "seeds, seeds and queries both random); won / tied / "
                     "lost: queries better / equal / worse perturbed; effect: mean difference / its standard deviation.")
    notes += _against_the_first_row([label for label, _ in systems], values, columns, test, ci)
    sizes = {}
    for name in sets:  # the queries of each set, from the first system that has it
        found = next((v[f"{name} {DISPLAY_NAMES[metrics[0]]}"] for v in values.values()
                      if f"{name} {DISPLAY_NAMES[metrics[0]]}" in v), None)
        if found is not None:
            sizes[name] = len(found)
    if sizes:
        notes.append("Queries: " + ", ".join(f"{name} {n}" for name, n in sizes.items()) + ".")
    return Table(title, ["system"], columns, rows, notes, ci=ci, show_seeds=show_seeds)


def trial_file_robustness(tracker, path, test: str = "t", **options) -> Table:
    """The table of a trial file's trials (rows in file order), from their finished runs."""
    experiment, specs = load_trials(Path(path), TrialSpec)
    if not any(spec.robustness for spec in specs):
        raise InputError(path, "no trial sets robustness: nothing was tested perturbed")
    runs = [tracker.find_run(None, trial_key(spec), status="FINISHED") for spec in specs]
    return trials_robustness(tracker, experiment, specs, [r.info.run_id if r else None for r in runs], test, **options)


def trials_robustness(tracker, experiment: str, specs, run_ids: list[str | None], test: str = "t", **options) -> Table:
    """The table of these trials (``orchestrate run`` prints it), rows in order (``options``: those of
    :func:`robustness_table`)."""
    perturbations = list(dict.fromkeys(p for spec in specs for p in spec.robustness))
    systems = [(spec.name.removeprefix(f"{experiment}."), tracker.client.get_run(run_id) if run_id else None)
               for spec, run_id in zip(specs, run_ids)]
    return robustness_table(RunReader(tracker), systems, perturbations, f"robustness: {experiment}", test, **options)


def sweep_robustness(results, test: str = "t", **options) -> Table:
    """The table of a sweep's finished cells (``results``: ``report.results.SweepResults``): one row
    per system, its seeds averaged per query; a system shows once all its seeds finished."""
    perturbations = list(results.sweep.base.get("robustness") or [])
    if not perturbations:
        raise InputError(results.sweep.name, "base sets no robustness: nothing was tested perturbed")
    groups: dict[str, list] = {}
    for cell in results.cells:
        groups.setdefault(" / ".join(v for k, v in cell.axes.items() if k != "seed"), []).append(cell)
    systems = [(label, [c.run for c in cells]) for label, cells in groups.items() if all(c.status == STATUS_OK for c in cells)]
    return robustness_table(results.reader, systems, perturbations, f"robustness: {results.sweep.name}", test, **options)


__all__ = ["ROBUSTNESS_METRICS", "PerturbedMeasure", "perturbed_vs_clean", "robustness_table", "trials_robustness",
           "trial_file_robustness", "sweep_robustness"]
