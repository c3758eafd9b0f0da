"""A :class:`~orchestrator.report.tables.Table` rendered as Markdown, LaTeX or CSV: each format
shows the same numbers, significance markers (``†`` at 95%, ``°`` at 90%) and emphasis."""

from __future__ import annotations

import csv
import io

from orchestrator.report.results import STATUS_LABELS
from orchestrator.report.tables import Entry, Table

MARKERS = {0.05: "†", 0.10: "°"}
CORRECTION_SHORT = {"holm": "Holm", "bonferroni": "Bonferroni", "bh": "BH"}
LATEX_MARKERS = {0.05: r"$^{\dagger}$", 0.10: r"$^{\circ}$"}


def _plain(entry: Entry, digits: int) -> str:
    if entry.value is None:
        return STATUS_LABELS.get(entry.status, entry.status)
    return f"{entry.value:.{digits}f}"


def _percent(relative: float) -> str:
    return f"{round(relative, 1) or 0.0:+.1f}"  # no "-0.0": a change that rounds to zero is shown as +0.0


def _relative(entry: Entry) -> str:
    return f" ({_percent(entry.relative)}%)" if entry.relative is not None and not entry.is_baseline else ""


def _spread(entry: Entry, digits: int) -> str:
    return f" ± {entry.seed_std:.{digits}f}" if entry.seed_std is not None else ""


def _interval(entry: Entry, digits: int) -> str:
    return f"[{entry.ci[0]:+.{digits}f}, {entry.ci[1]:+.{digits}f}]" if entry.ci is not None else ""


def _effect(entry: Entry) -> str:
    return "-" if entry.effect is None else f"{entry.effect:+.2f}"


def _blocks(table: Table, digits: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """What the options add beneath a table, as (title, header, rows): each comparison against
    its baseline (``ci``) and each seed's value (``show_seeds``)."""
    blocks = []
    located = [(keys, column, entry) for keys, entries in table.rows for column, entry in zip(table.columns, entries)]
    if table.ci:
        corrected = table.correction != "none"
        rows = [keys + [column, f"{e.difference:+.{digits}f}", _interval(e, digits) or "-",
                        f"{e.direction.won} / {e.direction.tied} / {e.direction.lost}", _effect(e),
                        f"{e.raw_p_value:.3g}"] + ([f"{e.p_value:.3g}"] if corrected else [])
                for keys, column, e in located if e.difference is not None and e.direction is not None]
        if rows:
            name = CORRECTION_SHORT.get(table.correction, table.correction)
            blocks.append(("Against the baseline", table.row_header + ["column", "difference", "interval", "won / tied / lost",
                                                                       "effect", "p"] + ([f"p ({name})"] if corrected else []),
                           rows))
    if table.show_seeds:
        rows = [keys + [column, f"{e.value:.{digits}f}" + _spread(e, digits),
                        ", ".join(f"{seed}: {value:.{digits}f}" for seed, value in e.per_seed)]
                for keys, column, e in located if e.value is not None and e.per_seed]
        if rows:
            blocks.append(("Seeds", table.row_header + ["column", "mean ± std", "each seed"], rows))
    return blocks


def render_markdown(table: Table, digits: int = 4) -> str:
    def cell(entry: Entry) -> str:
        if entry.value is None:
            return _plain(entry, digits)
        text = _plain(entry, digits)
        text = f"**{text}**" if entry.emphasis == "best" else f"<u>{text}</u>" if entry.emphasis == "second" else text
        text += _spread(entry, digits) + _relative(entry) + MARKERS.get(entry.level, "")
        return text + (f" {_interval(entry, digits)}" if table.ci and entry.ci is not None else "")

    header = table.row_header + table.columns
    lines = [f"**{table.title}**", "", "| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] * len(table.row_header) + ["---:"] * len(table.columns)) + "|"]
    for keys, entries in table.rows:
        lines.append("| " + " | ".join(keys + [cell(e) for e in entries]) + " |")
    lines += [""] + [f"{note}  " for note in table.notes]
    for title, block_header, block_rows in _blocks(table, digits):
        lines += ["", f"{title}:", "", "| " + " | ".join(block_header) + " |", "|" + "|".join(["---"] * len(block_header)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in block_rows]
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
        if entry.seed_std is not None:
            text += r" {\small$\pm$" + f"{entry.seed_std:.{digits}f}" + "}"
        if entry.relative is not None and not entry.is_baseline:
            text += r" {\small(" + _percent(entry.relative) + r"\%)}"
        text += LATEX_MARKERS.get(entry.level, "")
        return text + (r" {\small" + _interval(entry, digits) + "}" if table.ci and entry.ci is not None else "")

    spec = "l" * len(table.row_header) + "r" * len(table.columns)
    lines = [f"% {latex_escape(table.title)}", r"\begin{tabular}{" + spec + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in table.row_header + table.columns) + r" \\", r"\midrule"]
    for keys, entries in table.rows:
        lines.append(" & ".join([latex_escape(k) for k in keys] + [cell(e) for e in entries]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    lines += [f"% {latex_escape(note)}" for note in table.notes]
    for title, block_header, block_rows in _blocks(table, digits):
        lines += [f"% {latex_escape(table.title)}: {title.lower()}", r"\begin{tabular}{" + "l" * (len(table.row_header) + 1)
                  + "r" * (len(block_header) - len(table.row_header) - 1) + "}", r"\toprule",
                  " & ".join(latex_escape(h) for h in block_header) + r" \\", r"\midrule"]
        lines += [" & ".join(latex_escape(c).replace("±", r"$\pm$") for c in row) + r" \\" for row in block_rows]
        lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def render_csv(table: Table, digits: int = 4) -> str:
    """One line per table entry, numbers unrounded, the state where there is no number.

    With ``ci``: the difference against the baseline, its interval, won / tied / lost, the
    effect size (the p-value before correction is in every CSV, beside the corrected one); with several seeds (or ``show_seeds``):
    the seeds' count and standard deviation (and each seed's value, ``seed=value;...``)."""
    def number(value) -> str:
        return "" if value is None else repr(value)

    seeded = table.show_seeds or any(e.seeds > 1 for _, entries in table.rows for e in entries)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = table.row_header + ["column", "status", "value", "relative_change_percent", "p_value", "p_value_uncorrected",
                                 "significant_at", "emphasis"]
    if table.ci:
        header += ["difference", "ci_low", "ci_high", "won", "tied", "lost", "effect_size"]
    if seeded:
        header += ["seeds", "seed_std"] + (["seed_values"] if table.show_seeds else [])
    writer.writerow(header)
    for keys, entries in table.rows:
        for column, entry in zip(table.columns, entries):
            row = keys + [column, entry.status, number(entry.value), number(entry.relative), number(entry.p_value),
                          number(entry.raw_p_value), "" if entry.level is None else f"{1 - entry.level:.0%}", entry.emphasis]
            if table.ci:
                d = entry.direction
                row += [number(entry.difference), *(number(x) for x in (entry.ci or (None, None))),
                        *(("", "", "") if d is None else (d.won, d.tied, d.lost)), number(entry.effect)]
            if seeded:
                row += [entry.seeds if entry.per_seed else "", number(entry.seed_std)]
                row += [";".join(f"{seed}={value!r}" for seed, value in entry.per_seed)] if table.show_seeds else []
            writer.writerow(row)
    return out.getvalue()


RENDERERS = {"md": render_markdown, "latex": render_latex, "csv": render_csv}
