"""Paper-style tables from a sweep (AUG Tables 1, 3 and 4).

A table is built as data (:class:`Table` of :class:`Entry`), then rendered as Markdown,
LaTeX or CSV (:mod:`orchestrator.report.render`), so every format shows the same numbers,
markers and emphasis:

- each system's value, its relative change against its baseline (same model and size, no
  augmentation, plain ranking loss) in percent, and a marker when a paired per-query test
  against that baseline is significant (``†`` at 95%, ``°`` at 90%), optionally corrected
  (Holm, Bonferroni or Benjamini-Hochberg) across every comparison of the table or sweep;
- per row, the best value in bold and the second best underlined (ties share the mark);
- a cell without a number shows its state (failed, stale, interrupted, pending, running, missing, n/a), never 0;
- a cell of several seeds: the mean over its seeds ``±`` their standard deviation; with
  ``seeds`` each seed's value too (a block beneath the table);
- with ``ci``: the t interval (95%, or the family's Bonferroni level) of the difference against the baseline in
  the cell, and beneath the table each comparison's difference, interval, queries won / tied /
  lost and effect size (:mod:`workloads.evaluation.statistics`);
- the family of the multiple-comparison correction (:class:`Family`): the table's
  comparisons, or every comparison of the sweep (each system against its baseline on every
  collection it was tested on), corrected by Holm, Bonferroni or Benjamini-Hochberg.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from orchestrator.report import legend
from orchestrator.report.legend import interval_confidence, test_name
from orchestrator.report.results import STATUS_OK, SYSTEM_AXES, SweepResults, SystemResult, baseline_of, systems
from workloads.core.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, mean_of
from workloads.evaluation.significance import (
    CORRECTION_NAMES,
    adjust_p_values,
    paired_test,
    relative_change,
    significance_level,
)
from workloads.evaluation.statistics import Direction, compare_uncertainty, difference_matrix, seed_summary, seeds_t_test


@dataclass(frozen=True)
class Entry:
    value: float | None
    status: str = STATUS_OK
    relative: float | None = None  # percent against the baseline
    p_value: float | None = None   # after correction
    level: float | None = None     # 0.05, 0.10 or None
    emphasis: str = ""             # "best", "second" or ""
    is_baseline: bool = False
    difference: float | None = None                # mean difference against the baseline
    ci: tuple[float, float] | None = None          # its t interval (when asked for), at the family's level
    relative_ci: tuple[float, float] | None = None  # the interval in percent of the baseline
    direction: Direction | None = None             # queries won / tied / lost
    effect: float | None = None                    # mean difference / its standard deviation
    raw_p_value: float | None = None               # before correction
    seeds: int = 1
    seed_std: float | None = None                  # the seeds' standard deviation (several seeds)
    per_seed: tuple[tuple[str, float], ...] = ()   # (seed, value) of each seed


@dataclass
class Table:
    title: str
    row_header: list[str]
    columns: list[str]
    rows: list[tuple[list[str], list[Entry]]]
    notes: list[str] = field(default_factory=list)
    ci: bool = False          # intervals in the cells, and the comparisons' block
    show_seeds: bool = False  # the seeds' block
    correction: str = "none"  # the markers' correction: the block shows raw and corrected p


# ----------------------------------------------------------------------------- building


FAMILIES = ("table", "sweep")


@dataclass(frozen=True)
class TableOptions:
    metric: str = "ndcg_at_10"
    test: str = "t"
    correction: str = "none"
    digits: int = 4
    family: str | None = None  # "table" or "sweep"; None: the table, its note worded as before the option
    ci: bool = False           # t intervals, won / tied / lost and effect sizes in the tables
    seeds: bool = False        # each seed's value
    measures: tuple[str, ...] = ()  # the sweep family's measures, corrected together (empty: ``metric`` alone)


@dataclass(frozen=True)
class Family:
    """The comparisons one correction runs over.

    ``table``: the comparisons a table shows (each table corrected on its own). ``sweep``:
    every system against its baseline on every collection the sweep was tested on (its test
    collection and each zero-shot one), for the table's measure or each of ``measures``;
    ``adjusted`` holds their corrected p-values by (measure, metric prefix, system label)."""

    scope: str
    correction: str
    size: int = 0
    collections: tuple[str, ...] = ()
    adjusted: dict[tuple[str, str, str], float] = field(default_factory=dict)
    measures: tuple[str, ...] = ()


def sweep_family(results: SweepResults, options: TableOptions) -> Family:
    """Every system-vs-baseline comparison of the sweep on ``options.metric`` (or on each of
    ``options.measures``), corrected together."""
    measures = options.measures or (options.metric,)
    pairs: dict[tuple[str, str, str], tuple[SystemResult, SystemResult]] = {}
    for metric in measures:
        for _, prefix in results.evaluation_targets():
            all_systems = systems(results, metric, prefix)
            for system in all_systems:
                baseline = None if system.is_baseline or system.status != STATUS_OK else baseline_of(system, all_systems)
                if baseline is not None and baseline.status == STATUS_OK:
                    pairs[(metric, prefix, system.label)] = (system, baseline)
    size = len(pairs) if options.correction != "none" else 1
    raw = {key: comparison_p(system, baseline, options.test, size) for key, (system, baseline) in pairs.items()}
    adjusted = adjust_p_values(list(raw.values()), options.correction)
    return Family("sweep", options.correction, len(raw), tuple(label for label, _ in results.evaluation_targets()),
                  dict(zip(raw, adjusted)), tuple(measures))


def _by_seed(system: SystemResult) -> dict[str, dict[str, float]]:
    return system.per_seed if system.per_seed else {"": system.per_query}


def comparison_p(system: SystemResult, baseline: SystemResult, test: str, family_size: int = 1) -> float:
    """The raw p of a system against its baseline: with the t-test and both trained with the same
    two or more seeds, the seeds-and-queries t (:func:`seeds_t_test`: a retrain's variance is in
    it); else ``test`` on the per-query values averaged over seeds."""
    if test == "t" and system.per_seed and baseline.per_seed and len(system.per_seed) > 1 \
            and set(system.per_seed) == set(baseline.per_seed):
        return seeds_t_test(difference_matrix(system.per_seed, baseline.per_seed))
    return paired_test(system.per_query, baseline.per_query, test, family_size=family_size).p_value


def _seed_fields(system: SystemResult) -> dict:
    """The seeds' count, spread (several seeds) and each seed's value."""
    if not system.per_seed:
        return {}
    summary = seed_summary(system.per_seed)
    per_seed = tuple((seed, mean_of(v.values()) if v else 0.0) for seed, v in system.per_seed.items())
    return {"seeds": summary.count, "seed_std": summary.std, "per_seed": per_seed}


def compare_with_baselines(all_systems: list[SystemResult], test: str, correction: str,
                           targets: list[SystemResult] | None = None, ci: bool = False,
                           adjusted: dict[str, float] | None = None, family_size: int | None = None) -> dict[int, Entry]:
    """An entry per system (by ``id``): value, relative change, corrected significance, the
    difference's direction and effect size (and its t interval with ``ci``, at the level of the
    family's correction: :func:`~orchestrator.report.legend.interval_confidence`).

    ``adjusted`` (system label -> corrected p-value) and ``family_size``: the p-values and size of
    a larger family (:func:`sweep_family`); without them the comparisons made here are the family."""
    entries: dict[int, Entry] = {}
    pairs: list[tuple[SystemResult, SystemResult]] = []
    for system in targets if targets is not None else all_systems:
        if system.status != STATUS_OK:
            entries[id(system)] = Entry(None, system.status, is_baseline=system.is_baseline)
            continue
        baseline = None if system.is_baseline else baseline_of(system, all_systems)
        entries[id(system)] = Entry(system.value, is_baseline=system.is_baseline, **_seed_fields(system))
        if baseline is not None and baseline.status == STATUS_OK:
            pairs.append((system, baseline))
    size = family_size if family_size is not None else len(pairs)
    confidence = interval_confidence(correction, size)
    tested: list[tuple[int, float]] = []
    for system, baseline in pairs:
        p = comparison_p(system, baseline, test, size if correction != "none" else 1)
        uncertainty = compare_uncertainty(_by_seed(system), _by_seed(baseline), interval=ci, confidence=confidence)
        interval = (uncertainty.interval.low, uncertainty.interval.high) if uncertainty.interval else None
        relative_ci = (tuple(100.0 * x / baseline.value for x in interval)
                       if interval is not None and baseline.value else None)
        entries[id(system)] = replace(entries[id(system)], relative=relative_change(system.value, baseline.value),
                                      p_value=p, raw_p_value=p, difference=uncertainty.difference, ci=interval,
                                      relative_ci=relative_ci, direction=uncertainty.direction, effect=uncertainty.effect)
        tested.append((id(system), p))
    if adjusted is not None:
        by_id = {id(s): s for s in (targets if targets is not None else all_systems)}
        corrected = [adjusted[by_id[key].label] for key, _ in tested]
    else:
        corrected = adjust_p_values([p for _, p in tested], correction)
    for (key, _), p in zip(tested, corrected):
        entries[key] = replace(entries[key], p_value=p, level=significance_level(p))
    return entries


def mark_best(entries: list[Entry], digits: int) -> list[Entry]:
    """Bold the best value of a row, underline the second best (as printed: ties share)."""
    shown = sorted({round(e.value, digits) for e in entries if e.value is not None}, reverse=True)
    marks = {value: mark for value, mark in zip(shown, ("best", "second"))}
    return [replace(e, emphasis=marks.get(round(e.value, digits), "")) if e.value is not None else e for e in entries]


def _corrected(options: TableOptions, num_tested: int, family: Family | None) -> str:
    """The marker line's correction: ", Holm-corrected over 4 comparisons" (of the table) or
    "... over the sweep's 12 comparisons"."""
    if options.correction == "none":
        return ""
    method = CORRECTION_NAMES[options.correction].split(" (")[0]
    if family is not None and family.scope == "sweep":
        return f", {method}-corrected over the sweep's {family.size} comparisons"
    return f", {method}-corrected over {num_tested} comparisons"


_METHODS = {"none": "no correction (each comparison at its own level)",
            "holm": "Holm's step-down correction (family-wise error rate)",
            "bonferroni": "Bonferroni's correction (family-wise error rate)",
            "bh": "Benjamini-Hochberg's correction (false discovery rate: a marker is a discovery at an FDR of 5% / 10%)"}


def _tested_size(options: TableOptions, num_tested: int, family: Family | None) -> int:
    """The family size the randomization test's resolution followed (1: no correction)."""
    if options.correction == "none":
        return 1
    return family.size if family is not None and family.scope == "sweep" else num_tested


def _comparisons(n: int) -> str:
    return f"{n} comparison" + ("" if n == 1 else "s")


def family_note(options: TableOptions, num_tested: int, family: Family | None, scope: str | None = None) -> str:
    """The note naming the family of the correction, its size and the method (``scope``: what
    the family is, when not a table of systems against their baselines)."""
    measures = family.measures if family is not None and family.scope == "sweep" and family.measures else (options.metric,)
    what = " and ".join(DISPLAY_NAMES.get(m, m) for m in measures)
    if scope is not None:
        scope = f"{scope}: {_comparisons(num_tested)}"
    elif family is not None and family.scope == "sweep":
        scope = (f"the sweep: {_comparisons(family.size)} (each system against its baseline on {what}, on every collection "
                 f"tested: {', '.join(family.collections)})")
    else:
        scope = f"this table: {_comparisons(num_tested)} (each system against its baseline)"
    return f"Multiple comparisons: the family is {scope}; {_METHODS[options.correction]}."


def uncertainty_notes(options: TableOptions, num_tested: int, family: Family | None, entries, compared: bool = True) -> list[str]:
    """The family (when asked about), the interval, the seeds and what the markers mean (:mod:`legend`)."""
    family_line = (family_note(options, num_tested, family)
                   if options.family is not None or options.correction == "bh" or options.ci else None)
    size = family.size if family is not None and family.scope == "sweep" else num_tested
    return legend.uncertainty_notes(options.test, options.correction, family_line, options.ci, size, entries, compared)


def _legend(options: TableOptions, num_tested: int, num_queries: int | None, collection: str,
            has_baseline: bool = True, family: Family | None = None) -> list[str]:
    corrected = _corrected(options, num_tested, family)
    queries = f" on {num_queries} queries" if num_queries else ""
    if not has_baseline:  # an EAR grid: its cells are not compared with a trained baseline
        return [f"{DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}{queries}; the grid has no baseline "
                "cell, so no change or significance is shown.",
                "Best per row in bold, second underlined. failed / stale / interrupted / pending / running / missing / "
                "n/a: no number (never 0)."]
    return [
        f"{DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}; in parentheses the change against the baseline "
        "(same model and size, no augmentation, plain ranking loss) in percent.",
        f"† p < 0.05, ° p < 0.10: {test_name(options.test, _tested_size(options, num_tested, family))}{queries} "
        f"against the baseline{corrected}.",
        "Best per row in bold, second underlined. failed / stale / interrupted / pending / running / missing / n/a: no number "
        "(never 0).",
    ]


def table_family(results: SweepResults, options: TableOptions, family: Family | None = None) -> Family:
    """The family the options ask for: the sweep's (computed once, or ``family``), else the table's."""
    if options.family == "sweep":
        return family if family is not None and family.scope == "sweep" else sweep_family(results, options)
    return Family("table", options.correction)


def family_p_values(family: Family, prefix: str, metric: str) -> dict[str, float] | None:
    """The sweep family's corrected p-values of ``metric`` on ``prefix`` by system label (None: the table is the family)."""
    if family.scope != "sweep":
        return None
    return {label: p for (measure, where, label), p in family.adjusted.items() if where == prefix and measure == metric}


def grid_table(results: SweepResults, prefix: str, collection: str, rows: tuple[str, ...], cols: str,
               options: TableOptions, family: Family | None = None) -> Table:
    """AUG Tables 1 and 3: rows are ``rows`` axes, columns the ``cols`` axis (then the other axes)."""
    for axis in (*rows, cols):
        if axis not in SYSTEM_AXES:
            raise InputError("--rows/--cols", f"unknown axis '{axis}' (choose from {', '.join(SYSTEM_AXES)})")
    if cols in rows:
        raise InputError("--cols", f"'{cols}' is already a row axis")
    rest = [a for a in SYSTEM_AXES if a not in rows and a != cols]
    all_systems = systems(results, options.metric, prefix)
    family = table_family(results, options, family)
    entries = compare_with_baselines(all_systems, options.test, options.correction, ci=options.ci,
                                     adjusted=family_p_values(family, prefix, options.metric),
                                     family_size=family.size if family.scope == "sweep" else None)

    def column_label(system: SystemResult) -> str:
        if system.is_baseline:
            return " / ".join(["baseline"] + [system.axes[a] for a in rest if a not in ("loss", "augmentation")])
        return " / ".join(system.axes[a] for a in (cols, *rest))

    columns: list[str] = []
    for system in sorted(all_systems, key=lambda s: not s.is_baseline):  # baselines first, else grid order
        if column_label(system) not in columns:
            columns.append(column_label(system))
    table_rows: dict[tuple[str, ...], dict[str, Entry]] = {}
    for system in all_systems:
        table_rows.setdefault(tuple(system.axes[a] for a in rows), {})[column_label(system)] = entries[id(system)]
    # The first stage's own value, for reference (the same for every row): not compared, never bold.
    first_stage = first_stage_value(results, prefix, options.metric)
    reference = [Entry(first_stage, STATUS_OK if first_stage is not None else "missing")]
    body = []
    for key, by_column in table_rows.items():
        row = [by_column.get(c, Entry(None, "missing")) for c in columns]
        body.append((list(key), reference + mark_best(row, options.digits)))
    num_queries = next((len(s.per_query) for s in all_systems if s.per_query), None)
    num_tested = sum(1 for e in entries.values() if e.p_value is not None)
    has_baseline = any(s.is_baseline for s in all_systems)
    legend = _legend(options, num_tested, num_queries, collection, has_baseline, family)
    first_stage_column = first_stage_title(results.first_stage_label(prefix))
    legend.append(f"{first_stage_column}: " + ("the ranking every system re-ranks" if has_baseline
                                               else f"{results.first_stage_label(prefix)} alone") +
                  ", for reference (not compared, not marked).")
    legend += uncertainty_notes(options, num_tested, family, entries.values(), compared=has_baseline)
    return Table(f"{results.sweep.name}: {DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}",
                 list(rows), [first_stage_column, *columns], body, legend, ci=options.ci, show_seeds=options.seeds,
                 correction=options.correction)


def first_stage_title(label: str) -> str:
    """The reference column (and plot line) of the first stage every system re-ranks: ``BM25 (first stage)``."""
    return f"{label} (first stage)"


def first_stage_value(results: SweepResults, prefix: str, metric: str) -> float | None:
    """The first stage's ``metric`` on ``prefix``'s queries, from its per-query values."""
    evaluation = results.first_stage(prefix)
    if evaluation is None or metric not in evaluation.values or not evaluation.values[metric]:
        return None
    values = evaluation.values[metric]
    return mean_of(values.values())


def select_system(candidates: list[SystemResult], select: dict[str, str]) -> SystemResult | None:
    """The system a zero-shot or transfer table shows for one model.

    With ``select`` (axis -> value): the system matching it. Without: the finished
    non-baseline system of the largest size with the best validation nDCG@10 (chosen on
    validation, never on test).
    """
    pool = [s for s in candidates if not s.is_baseline]
    if select:
        matching = [s for s in pool if all(s.axes.get(k) == v for k, v in select.items())]
        return matching[0] if len(matching) == 1 else None
    sizes = [s.axes["size"] for s in pool]
    if not sizes:
        return None
    largest = max(sizes, key=lambda v: float("inf") if v == "full" else int(v))
    finished = [s for s in pool if s.axes["size"] == largest and s.validation is not None]
    return max(finished, key=lambda s: s.validation, default=None)


def zero_shot_table(results: SweepResults, options: TableOptions, select: dict[str, str], family: Family | None = None) -> Table:
    """AUG Table 4: collections as rows (the baseline beneath each), models as columns, an average row."""
    models = list(dict.fromkeys(c.axes["model"] for c in results.cells))
    targets = results.evaluation_targets()
    family = table_family(results, options, family)
    body: list[tuple[list[str], list[Entry]]] = []
    per_model_values: dict[str, list[tuple[float | None, float | None]]] = {m: [] for m in models}
    chosen_labels = {}
    for label, prefix in targets:
        all_systems = systems(results, options.metric, prefix)
        row, baseline_row = [], []
        for model in models:
            chosen = select_system([s for s in all_systems if s.axes["model"] == model], select)
            if chosen is None:
                row.append(Entry(None, "missing"))
                baseline_row.append(Entry(None, "missing"))
                per_model_values[model].append((None, None))
                continue
            chosen_labels[model] = chosen.label
            baseline = baseline_of(chosen, all_systems)
            shown = [chosen] + ([baseline] if baseline else [])
            # the table's family: corrected below
            entries = compare_with_baselines(all_systems, options.test, "none", shown, ci=options.ci,
                                             adjusted=family_p_values(family, prefix, options.metric))
            row.append(entries[id(chosen)])
            base_entry = entries[id(baseline)] if baseline else Entry(None, "missing")
            baseline_row.append(base_entry)
            per_model_values[model].append((entries[id(chosen)].value, base_entry.value))
        body.append(([label], row))
        body.append((["  baseline"], baseline_row))
    # Correct across every system-vs-baseline test of the table, as the grid table does.
    tested = [(r, i) for r, (_, row) in enumerate(body) for i, e in enumerate(row) if e.p_value is not None]
    num_tested = len(tested)
    if family.scope == "table":
        adjusted = adjust_p_values([body[r][1][i].p_value for r, i in tested], options.correction)
        for (r, i), p in zip(tested, adjusted):
            body[r][1][i] = replace(body[r][1][i], p_value=p, level=significance_level(p))
    average, baseline_average = [], []
    for model in models:
        pairs = per_model_values[model]
        complete = pairs and all(v is not None and b is not None for v, b in pairs)
        if not complete:
            average.append(Entry(None, "missing"))
            baseline_average.append(Entry(None, "missing"))
            continue
        mean_value = mean_of(v for v, _ in pairs)
        mean_baseline = mean_of(b for _, b in pairs)
        average.append(Entry(mean_value, relative=relative_change(mean_value, mean_baseline)))
        baseline_average.append(Entry(mean_baseline, is_baseline=True))
    body.append((["average"], average))
    body.append((["  baseline"], baseline_average))
    notes = _legend(options, num_tested, None, "each collection", family=family)[:2]
    notes[0] = (f"{DISPLAY_NAMES.get(options.metric, options.metric)} of each model's selected system "
                + ("(" + ", ".join(f"{k}={v}" for k, v in select.items()) + ")" if select
                   else "(best validation nDCG@10 among the largest training size)")
                + ", with its baseline beneath; the average row has no significance test.")
    notes.append("systems: " + "; ".join(f"{m}: {label}" for m, label in chosen_labels.items()))
    notes += uncertainty_notes(options, num_tested, family, [e for _, row in body for e in row])
    return Table(f"{results.sweep.name}: zero-shot {DISPLAY_NAMES.get(options.metric, options.metric)}",
                 ["collection"], models, body, notes, ci=options.ci, show_seeds=options.seeds,
                 correction=options.correction)


def transfer_table(all_results: list[SweepResults], options: TableOptions, select: dict[str, str]) -> Table:
    """CFT's cross-dataset transfer: training collection (and model) x test collection."""
    columns: list[str] = []
    for results in all_results:
        for label, _ in results.evaluation_targets():
            if label not in columns:
                columns.append(label)
    body = []
    for results in all_results:
        train = results.train_collection.rsplit("/", 1)[-1]
        models = list(dict.fromkeys(c.axes["model"] for c in results.cells))
        values: dict[str, dict[str, Entry]] = {m: {} for m in models}
        for label, prefix in results.evaluation_targets():
            all_systems = systems(results, options.metric, prefix)
            for model in models:
                chosen = select_system([s for s in all_systems if s.axes["model"] == model], select)
                values[model][label] = (Entry(chosen.value, chosen.status) if chosen is not None else Entry(None, "missing"))
        for model in models:
            body.append(([train, model], [values[model].get(c, Entry(None, "missing")) for c in columns]))
    return Table(f"transfer: {DISPLAY_NAMES.get(options.metric, options.metric)}, train collection x test collection",
                 ["train", "model"], columns, body,
                 ["Each row: the selected system of a sweep (best validation nDCG@10 at the largest size unless --select); "
                  "missing: the sweep did not evaluate that collection."])
