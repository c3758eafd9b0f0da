"""Paper-style tables from a sweep (AUG Tables 1, 3 and 4).

A table is built as data (:class:`Table` of :class:`Entry`), then rendered as Markdown,
LaTeX or CSV, so every format shows the same numbers, markers and emphasis:

- each system's value, its relative change against its baseline (same model and size, no
  augmentation, plain ranking loss) in percent, and a marker when a paired per-query test
  against that baseline is significant (``†`` at 95%, ``°`` at 90%), optionally corrected
  (Holm or Bonferroni) across every comparison of the table;
- per row, the best value in bold and the second best underlined (ties share the mark);
- a cell without a number shows its state (failed, stale, interrupted, pending, running, missing, n/a), never 0.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field, replace

from orchestrator.report.results import STATUS_LABELS, STATUS_OK, SYSTEM_AXES, SweepResults, SystemResult, baseline_of, systems
from workloads.errors import InputError
from workloads.evaluation import DISPLAY_NAMES
from workloads.evaluation.significance import TEST_NAMES, adjust_p_values, paired_test, relative_change, significance_level

MARKERS = {0.05: "†", 0.10: "°"}
LATEX_MARKERS = {0.05: r"$^{\dagger}$", 0.10: r"$^{\circ}$"}


@dataclass(frozen=True)
class Entry:
    value: float | None
    status: str = STATUS_OK
    relative: float | None = None  # percent against the baseline
    p_value: float | None = None   # after correction
    level: float | None = None     # 0.05, 0.10 or None
    emphasis: str = ""             # "best", "second" or ""
    is_baseline: bool = False


@dataclass
class Table:
    title: str
    row_header: list[str]
    columns: list[str]
    rows: list[tuple[list[str], list[Entry]]]
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- building


@dataclass(frozen=True)
class TableOptions:
    metric: str = "ndcg_at_10"
    test: str = "t"
    correction: str = "none"
    digits: int = 4


def compare_with_baselines(all_systems: list[SystemResult], test: str, correction: str,
                           targets: list[SystemResult] | None = None) -> dict[int, Entry]:
    """An entry per system (by ``id``): value, relative change and corrected significance."""
    entries: dict[int, Entry] = {}
    tested: list[tuple[int, float]] = []
    for system in targets if targets is not None else all_systems:
        if system.status != STATUS_OK:
            entries[id(system)] = Entry(None, system.status, is_baseline=system.is_baseline)
            continue
        baseline = None if system.is_baseline else baseline_of(system, all_systems)
        entry = Entry(system.value, is_baseline=system.is_baseline)
        if baseline is not None and baseline.status == STATUS_OK:
            comparison = paired_test(system.per_query, baseline.per_query, test)
            entry = replace(entry, relative=relative_change(system.value, baseline.value), p_value=comparison.p_value)
            tested.append((id(system), comparison.p_value))
        entries[id(system)] = entry
    adjusted = adjust_p_values([p for _, p in tested], correction)
    for (key, _), p in zip(tested, adjusted):
        entries[key] = replace(entries[key], p_value=p, level=significance_level(p))
    return entries


def mark_best(entries: list[Entry], digits: int) -> list[Entry]:
    """Bold the best value of a row, underline the second best (as printed: ties share)."""
    shown = sorted({round(e.value, digits) for e in entries if e.value is not None}, reverse=True)
    marks = {value: mark for value, mark in zip(shown, ("best", "second"))}
    return [replace(e, emphasis=marks.get(round(e.value, digits), "")) if e.value is not None else e for e in entries]


def _legend(options: TableOptions, num_tested: int, num_queries: int | None, collection: str,
            has_baseline: bool = True) -> list[str]:
    corrected = "" if options.correction == "none" else f", {options.correction.capitalize()}-corrected over {num_tested} comparisons"
    queries = f" on {num_queries} queries" if num_queries else ""
    if not has_baseline:  # an EAR grid: its cells are not compared with a trained baseline
        return [f"{DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}{queries}; the grid has no baseline "
                "cell, so no change or significance is shown.",
                "Best per row in bold, second underlined. failed / stale / interrupted / pending / running / missing / "
                "n/a: no number (never 0)."]
    return [
        f"{DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}; in parentheses the change against the baseline "
        "(same model and size, no augmentation, plain ranking loss) in percent.",
        f"† p < 0.05, ° p < 0.10: {TEST_NAMES[options.test]}{queries} against the baseline{corrected}.",
        "Best per row in bold, second underlined. failed / stale / interrupted / pending / running / missing / n/a: no number "
        "(never 0).",
    ]


def grid_table(results: SweepResults, prefix: str, collection: str, rows: tuple[str, ...], cols: str,
               options: TableOptions) -> Table:
    """AUG Tables 1 and 3: rows are ``rows`` axes, columns the ``cols`` axis (then the other axes)."""
    for axis in (*rows, cols):
        if axis not in SYSTEM_AXES:
            raise InputError("--rows/--cols", f"unknown axis '{axis}' (choose from {', '.join(SYSTEM_AXES)})")
    if cols in rows:
        raise InputError("--cols", f"'{cols}' is already a row axis")
    rest = [a for a in SYSTEM_AXES if a not in rows and a != cols]
    all_systems = systems(results, options.metric, prefix)
    entries = compare_with_baselines(all_systems, options.test, options.correction)

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
    legend = _legend(options, num_tested, num_queries, collection, has_baseline)
    legend.append(f"{FIRST_STAGE_COLUMN}: " + ("the ranking every system re-ranks" if has_baseline else "BM25 alone") +
                  ", for reference (not compared, not marked).")
    return Table(f"{results.sweep.name}: {DISPLAY_NAMES.get(options.metric, options.metric)} on {collection}",
                 list(rows), [FIRST_STAGE_COLUMN, *columns], body, legend)


FIRST_STAGE_COLUMN = "BM25 (first stage)"


def first_stage_value(results: SweepResults, prefix: str, metric: str) -> float | None:
    """The first stage's ``metric`` on ``prefix``'s queries, from its per-query values."""
    evaluation = results.first_stage(prefix)
    if evaluation is None or metric not in evaluation.values or not evaluation.values[metric]:
        return None
    values = evaluation.values[metric]
    return sum(values.values()) / len(values)


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


def zero_shot_table(results: SweepResults, options: TableOptions, select: dict[str, str]) -> Table:
    """AUG Table 4: collections as rows (the baseline beneath each), models as columns, an average row."""
    models = list(dict.fromkeys(c.axes["model"] for c in results.cells))
    targets = results.evaluation_targets()
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
            entries = compare_with_baselines(all_systems, options.test, "none", shown)  # corrected below
            row.append(entries[id(chosen)])
            base_entry = entries[id(baseline)] if baseline else Entry(None, "missing")
            baseline_row.append(base_entry)
            per_model_values[model].append((entries[id(chosen)].value, base_entry.value))
        body.append(([label], row))
        body.append((["  baseline"], baseline_row))
    # Correct across every system-vs-baseline test of the table, as the grid table does.
    tested = [(r, i) for r, (_, row) in enumerate(body) for i, e in enumerate(row) if e.p_value is not None]
    num_tested = len(tested)
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
        mean_value = sum(v for v, _ in pairs) / len(pairs)
        mean_baseline = sum(b for _, b in pairs) / len(pairs)
        average.append(Entry(mean_value, relative=relative_change(mean_value, mean_baseline)))
        baseline_average.append(Entry(mean_baseline, is_baseline=True))
    body.append((["average"], average))
    body.append((["  baseline"], baseline_average))
    notes = _legend(options, num_tested, None, "each collection")[:2]
    notes[0] = (f"{DISPLAY_NAMES.get(options.metric, options.metric)} of each model's selected system "
                + ("(" + ", ".join(f"{k}={v}" for k, v in select.items()) + ")" if select
                   else "(best validation nDCG@10 among the largest training size)")
                + ", with its baseline beneath; the average row has no significance test.")
    notes.append("systems: " + "; ".join(f"{m}: {label}" for m, label in chosen_labels.items()))
    return Table(f"{results.sweep.name}: zero-shot {DISPLAY_NAMES.get(options.metric, options.metric)}",
                 ["collection"], models, body, notes)


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


# ----------------------------------------------------------------------------- rendering


def _plain(entry: Entry, digits: int) -> str:
    if entry.value is None:
        return STATUS_LABELS.get(entry.status, entry.status)
    return f"{entry.value:.{digits}f}"


def _percent(relative: float) -> str:
    return f"{round(relative, 1) or 0.0:+.1f}"  # no "-0.0": a change that rounds to zero is shown as +0.0


def _relative(entry: Entry) -> str:
    return f" ({_percent(entry.relative)}%)" if entry.relative is not None and not entry.is_baseline else ""


def render_markdown(table: Table, digits: int = 4) -> str:
    def cell(entry: Entry) -> str:
        if entry.value is None:
            return _plain(entry, digits)
        text = _plain(entry, digits)
        text = f"**{text}**" if entry.emphasis == "best" else f"<u>{text}</u>" if entry.emphasis == "second" else text
        return text + _relative(entry) + MARKERS.get(entry.level, "")

    header = table.row_header + table.columns
    lines = [f"**{table.title}**", "", "| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] * len(table.row_header) + ["---:"] * len(table.columns)) + "|"]
    for keys, entries in table.rows:
        lines.append("| " + " | ".join(keys + [cell(e) for e in entries]) + " |")
    lines += [""] + [f"{note}  " for note in table.notes]
    return "\n".join(lines).rstrip() + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(table: Table, digits: int = 4) -> str:
    """A booktabs ``tabular`` (needs ``\\usepackage{booktabs}``), one table row per line."""
    def cell(entry: Entry) -> str:
        if entry.value is None:
            return r"\textit{" + latex_escape(_plain(entry, digits)) + "}"
        text = _plain(entry, digits)
        text = r"\textbf{" + text + "}" if entry.emphasis == "best" else r"\underline{" + text + "}" if entry.emphasis == "second" else text
        if entry.relative is not None and not entry.is_baseline:
            text += r" {\small(" + _percent(entry.relative) + r"\%)}"
        return text + LATEX_MARKERS.get(entry.level, "")

    spec = "l" * len(table.row_header) + "r" * len(table.columns)
    lines = [f"% {latex_escape(table.title)}", r"\begin{tabular}{" + spec + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in table.row_header + table.columns) + r" \\", r"\midrule"]
    for keys, entries in table.rows:
        lines.append(" & ".join([latex_escape(k) for k in keys] + [cell(e) for e in entries]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% {latex_escape(note)}" for note in table.notes]
    return "\n".join(lines) + "\n"


def render_csv(table: Table, digits: int = 4) -> str:
    """One line per table entry, numbers unrounded, the state where there is no number."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.row_header + ["column", "status", "value", "relative_change_percent", "p_value",
                                        "significant_at", "emphasis"])
    for keys, entries in table.rows:
        for column, entry in zip(table.columns, entries):
            writer.writerow(keys + [column, entry.status, "" if entry.value is None else repr(entry.value),
                                    "" if entry.relative is None else repr(entry.relative),
                                    "" if entry.p_value is None else repr(entry.p_value),
                                    "" if entry.level is None else f"{1 - entry.level:.0%}", entry.emphasis])
    return out.getvalue()


RENDERERS = {"md": render_markdown, "latex": render_latex, "csv": render_csv}
