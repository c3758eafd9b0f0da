"""``orchestrate report``: a sweep's tables and figures, written to disk and to its MLflow sweep run.

Every number is recomputed from the per-query values stored with the cell runs (and
checked against the logged aggregates, see :mod:`orchestrator.report.results`). Files are
written whole (to a temporary name, then renamed): a failed report leaves no partial file.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.report.first_stage import compare_with_first_stage, render_first_stage_csv, render_first_stage_markdown
from orchestrator.report.render import RENDERERS, render_csv, render_latex, render_markdown
from orchestrator.report.results import STATUS_OK, SYSTEM_AXES, SweepResults, load_sweep_results, systems, winners
from orchestrator.report.tables import (
    Table,
    TableOptions,
    compare_with_baselines,
    family_p_values,
    first_stage_title,
    first_stage_value,
    grid_table,
    table_family,
    transfer_table,
    zero_shot_table,
)
from orchestrator.sweep.grid import SweepSpec
from orchestrator.sweep.status import cannot_check_line
from orchestrator.sweep.store import experiment_owner
from workloads.core.errors import InputError
from workloads.core.logs import get_logger

_log = get_logger("report").info


def _write(path: Path, text: str) -> Path:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return path


def _write_table(table: Table, stem: Path, digits: int) -> list[Path]:
    """The table in every format: ``<stem>.md``, ``.tex`` and ``.csv``."""
    written = ((render_markdown, "md"), (render_latex, "tex"), (render_csv, "csv"))
    return [_write(stem.with_name(f"{stem.name}.{suffix}"), render(table, digits)) for render, suffix in written]


def parse_select(text: str | None) -> dict[str, str]:
    """``loss=pointwise+scl,augmentation=bm25`` -> {axis: value}."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        axis, sep, value = part.partition("=")
        if not sep or axis.strip() not in SYSTEM_AXES:
            raise InputError("--select", f"'{part}' is not AXIS=VALUE with AXIS one of {', '.join(SYSTEM_AXES)}")
        out[axis.strip()] = value.strip()
    return out


@dataclass
class ReportRequest:
    options: TableOptions
    rows: tuple[str, ...] = ("model", "size")
    cols: str = "augmentation"
    collection: str | None = None
    output_format: str = "md"
    zero_shot: bool = False
    transfer: bool = False
    select: dict[str, str] = field(default_factory=dict)
    plots: bool = True
    log_to_mlflow: bool = False  # the files and the table also on the sweep run (the sweep logs its own report)


@dataclass
class ReportOutput:
    text: str
    files: list[Path]


def load_results(sweep: SweepSpec, tracker: Tracker) -> SweepResults:
    experiment = tracker.client.get_experiment_by_name(sweep.name)
    if experiment is None:
        raise InputError(sweep.name, f"no MLflow experiment '{sweep.name}' in {tracker.uri}: run the sweep first")

    experiment_owner(sweep, tracker, experiment)  # another file's sweep of this name is one line; a copied store is its own
    unchecked = cannot_check_line(sweep)
    if unchecked:
        get_logger("report").warning("%s: %s", sweep.name, unchecked)
    return load_sweep_results(sweep, tracker)


def build_report(sweeps: list[SweepSpec], tracker: Tracker, out_root: Path, request: ReportRequest) -> ReportOutput:
    all_results = [load_results(sweep, tracker) for sweep in sweeps]
    blocks: list[str] = []
    files: list[Path] = []
    renderer = RENDERERS[request.output_format]
    for results in all_results:
        out_dir = Path(out_root) / results.sweep.name
        prefix = results.prefix_for(request.collection)
        label = next(lbl for lbl, p in results.evaluation_targets() if p == prefix)
        _log(f"{results.sweep.name}: reading per-query values of {sum(c.status == STATUS_OK for c in results.cells)} "
             f"finished cells ({len(results.cells)} in the grid)")
        family = table_family(results, request.options)  # the sweep's: every comparison read and tested once
        # one set of tables per measure of the family (--measures), each with its own measure's values
        per_measure = [replace(request.options, metric=m) for m in request.options.measures] or [request.options]
        tables: list[tuple[str, TableOptions, Table]] = []
        for options in per_measure:
            tables.append(("table", options, grid_table(results, prefix, label, request.rows, request.cols, options, family)))
            if request.zero_shot:
                tables.append(("zero-shot", options, zero_shot_table(results, options, request.select, family)))
        out_dir.mkdir(parents=True, exist_ok=True)  # once the tables exist: bad options write nothing
        sweep_files: list[Path] = []
        for stem, options, table in tables:
            blocks.append(renderer(table, options.digits))
            sweep_files += _write_table(table, out_dir / f"{stem}-{options.metric}-{label}", options.digits)
        against = [(options, compare_with_first_stage(results, prefix, options.metric)) for options in per_measure]
        against = [(options, comparison) for options, comparison in against if comparison is not None]
        against_text = ""
        for options, comparison in against:  # a fused final ranking: fused, alone and the first stage side by side
            markdown = render_first_stage_markdown(comparison, options.metric, label, options.digits)
            against_text += markdown
            if request.output_format != "csv":
                blocks.append(markdown)
            stem = out_dir / f"first-stage-{options.metric}-{label}"
            sweep_files += [_write(stem.with_suffix(".md"), markdown), _write(stem.with_suffix(".csv"), render_first_stage_csv(comparison))]
        if request.plots:
            for options in per_measure:
                sweep_files += _plots(results, prefix, label, options, out_dir, family)
        chosen, chosen_files = winners_block(results, out_dir)
        sweep_files += chosen_files
        if chosen and request.output_format != "csv":
            blocks.append(chosen)
        selectors = selector_block(tracker, results.experiment_id)
        if selectors and request.output_format != "csv":
            blocks.append(selectors)
        if request.output_format != "csv":
            blocks.append(search_line(tracker, results))
        if request.log_to_mlflow:
            _log_to_mlflow(tracker, results, sweep_files,
                           render_markdown(tables[0][2], request.options.digits) + (f"\n{against_text}" if against_text else ""))
        files += sweep_files
    if request.transfer:
        table = transfer_table(all_results, request.options, request.select)
        blocks.append(renderer(table, request.options.digits))
        transfer_dir = Path(out_root) / "transfer"
        transfer_dir.mkdir(parents=True, exist_ok=True)  # after the table: bad options write nothing
        files += _write_table(table, transfer_dir / f"transfer-{request.options.metric}", request.options.digits)
    return ReportOutput("\n".join(blocks), files)


def search_line(tracker: Tracker, results: SweepResults) -> str:
    """How the search spent its trials: complete, pruned (by the cells' pruner), failed."""
    runs = tracker.runs_of_kind(results.experiment_id, schema.TRIAL)
    count = {status: sum(1 for r in runs if r.info.status == status) for status in ("FINISHED", "KILLED", "FAILED", "RUNNING")}
    pruned_after = sorted(int(r.data.tags[schema.PRUNED_TAG]) for r in runs if schema.PRUNED_TAG in r.data.tags)
    where = f" (after epoch {', '.join(str(e) for e in sorted(set(pruned_after)))})" if pruned_after else ""
    return (f"Search ({results.sweep.search.pruner} pruner): {len(runs)} trial runs: {count['FINISHED']} complete, "
            f"{count['KILLED']} pruned{where}, {count['FAILED']} failed" + (f", {count['RUNNING']} running" if count["RUNNING"] else "")
            + "\n")


PRINTED_WINNERS = 40  # more cells than this: the winners' table is in its files only


def winners_block(results: SweepResults, out_dir: Path) -> tuple[str, list[Path]]:
    """The tested cells' winning hyper-parameters (``winners.md`` and ``winners.csv``), under the
    param names the MLflow UI compares; printed for grids of up to PRINTED_WINNERS cells."""
    rows = winners(results)
    if not rows:
        return "", []
    last = (schema.BEST_OBJECTIVE, schema.TRIALS_COMPLETE)
    columns = [*dict.fromkeys(name for row in rows for name in row if name not in last), *last]
    values = [[row.get(name, "-") for name in columns] for row in rows]

    def short(name: str, value: str) -> str:  # a searched value to 3 significant digits (the CSV keeps them all)
        if name in schema.GRID_AXES or name in last:
            return value
        try:
            return f"{float(value):.3g}"
        except ValueError:
            return value

    markdown = "\n".join([f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}",
                          *(f"| {' | '.join(short(n, v) for n, v in zip(columns, row))} |" for row in values)]) + "\n"
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([columns, *values])
    files = [_write(out_dir / "winners.md", markdown), _write(out_dir / "winners.csv", buffer.getvalue())]
    title = f"Winners' hyper-parameters ({len(rows)} tested cells; {out_dir / 'winners.csv'})"
    return (f"{title}\n\n{markdown}" if len(rows) <= PRINTED_WINNERS else f"{title}\n"), files


def selector_block(tracker: Tracker, experiment_id: str) -> str:
    """The sweep's trained selectors and the held-out ranking quality of their select-and-rank
    models (test measures beside BM25 on the same queries); empty when it trained none."""
    runs = tracker.runs_of_kind(experiment_id, schema.SELECTOR)
    if not runs:
        return ""
    lines = ["Selectors (select-and-rank on the test queries; BM25 on the same queries)", "",
             "| selector | method | pairs | data | epochs | val nDCG@10 | test nDCG@10 | test AP | test RR@10 | BM25 nDCG@10 | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: r.info.run_name or ""):
        m, tags = run.data.metrics, run.data.tags
        def value(name: str, m=m) -> str:
            return f"{m[name]:.4f}" if name in m else "-"

        lines.append(f"| {run.info.run_name} | {tags.get('augmentation', '?')} | {tags.get('size', '?')} | "
                     f"{tags.get(schema.SELECTOR_DATA_TAG, '?')} | {int(m.get(schema.EPOCHS_RUN, 0)) or '-'} | "
                     f"{value(schema.BEST_OBJECTIVE)} | {value('test_ndcg_at_10')} | {value('test_ap')} | "
                     f"{value('test_rr_at_10')} | {value('bm25_test_ndcg_at_10')} | {run.info.status} |")
    return "\n".join(lines) + "\n"


def _plots(results: SweepResults, prefix: str, label: str, options: TableOptions, out_dir: Path, family=None) -> list[Path]:
    # noqa below: matplotlib loads only when figures are drawn, not for every report command
    from orchestrator.report.plots import plot_metric_by_size, plot_relative_by_size  # noqa: PLC0415

    all_systems = systems(results, options.metric, prefix)
    if not any(s.status == STATUS_OK for s in all_systems):
        _log(f"{results.sweep.name}: no finished cell yet, no figures")
        return []
    entries = compare_with_baselines(all_systems, options.test, options.correction, ci=options.ci,  # error bars with --ci
                                     adjusted=family_p_values(family, prefix, options.metric) if family is not None else None)
    written = []
    for model in dict.fromkeys(s.axes["model"] for s in all_systems):
        mine = [s for s in all_systems if s.axes["model"] == model]
        safe = model.replace("/", "_")
        written.append(plot_metric_by_size(mine, model, options.metric, label, out_dir / f"by-size-{safe}-{options.metric}-{label}.png",
                                           first_stage_value(results, prefix, options.metric),
                                           first_stage_title(results.first_stage_label(prefix))))
        written.append(plot_relative_by_size(mine, entries, model, options.metric, label,
                                             out_dir / f"relative-{safe}-{options.metric}-{label}.png"))
    return written


def _log_to_mlflow(tracker: Tracker, results: SweepResults, files: list[Path], table_markdown: str) -> None:
    """The files as artifacts of the sweep run, and the table as its description in the UI."""
    run_id = tracker.sweep_run(results.experiment_id, results.sweep.name)
    for path in files:
        tracker.log_file(run_id, path, "report")
    tracker.describe(run_id, table_markdown)
    _log(f"{results.sweep.name}: {len(files)} files logged to MLflow run {run_id} (artifacts/report)")
