"""Reports, comparisons and figures on an MLflow store written the way a sweep writes it.

The store is constructed (no training): a grid of 10 cells where, at size 100, SCL is a
consistent gain over the baseline (significant) and CTriplet gains and losses cancel (not
significant); at size 200 SCL failed and CTriplet never ran; the linear-selector cells never
ran (pending). Every expectation below follows from that construction.
"""

import csv
import dataclasses
import io
import os
import re

import numpy as np
import pytest
import yaml
from scipy import stats

import orchestrator.report.plots as plots
import orchestrator.report.tables as tables
from orchestrator.core.schema import KIND_TAG, NOTE_TAG
from orchestrator.core.tracking import Tracker
from orchestrator.report.compare import compare_runs, format_comparison
from orchestrator.report.render import RENDERERS, render_csv, render_latex, render_markdown
from orchestrator.report.results import load_sweep_results, systems, winners
from orchestrator.report.robustness import robustness_table
from orchestrator.report.tables import TableOptions, compare_with_baselines, grid_table, transfer_table, zero_shot_table
from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.runner import _cell_runs
from tests.helpers import run_cli
from tests.report.test_robustness import _reader
from tests.workloads.evaluation.test_statistics import _t_reference
from workloads.core.errors import InputError
from workloads.evaluation import Evaluation
from workloads.evaluation.significance import paired_test

QUERIES = [f"q{i:02d}" for i in range(40)]
ZS_QUERIES = [f"n{i:02d}" for i in range(30)]

SWEEP = {
    "name": "report-grid",
    "base": {"data": {"collection": "beir/scifact"}},
    "grid": {
        "models": ["tiny"],
        "losses": [{"ranking": "pointwise", "contrastive": "scl"}, {"ranking": "pointwise", "contrastive": "ctriplet"}],
        "augmentations": [{"method": "bm25", "k": 2}, {"method": "linear"}],
        "sizes": [100, 200],
    },
    "zero_shot": [{"collection": "beir/nfcorpus"}],
    "search": {"trials_per_cell": 1},
}


def _evaluation(values: np.ndarray, queries: list[str]) -> Evaluation:
    ndcg = dict(zip(queries, map(float, values)))
    ap = {q: v / 2 for q, v in ndcg.items()}
    return Evaluation({"ndcg_at_10": float(np.mean(list(ndcg.values()))), "ap": float(np.mean(list(ap.values())))},
                      {"ndcg_at_10": ndcg, "ap": ap}, 1, len(queries))


FIRST_STAGE = np.linspace(0.7, 0.9, 40)  # BM25 above every system: shown for reference, never marked best


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    work = tmp_path_factory.mktemp("report")
    uri = f"sqlite:///{work / 'mlflow.db'}"
    tracker = Tracker(uri)
    sweep = SweepSpec.model_validate(SWEEP)
    cells = {(c.axes["loss"], c.axes["augmentation"], c.axes["size"]): c for c in expand_grid(sweep)}
    rng = np.random.default_rng(3)
    baseline = rng.uniform(0.2, 0.6, len(QUERIES))
    zs_baseline = rng.uniform(0.1, 0.5, len(ZS_QUERIES))
    cancel = np.tile([0.05, -0.05], len(QUERIES) // 2)
    values = {
        ("pointwise", "none", "100"): (baseline, zs_baseline, 0.40),
        ("pointwise+scl", "bm25", "100"): (baseline + 0.08 + rng.normal(0, 0.02, len(QUERIES)), zs_baseline + 0.05, 0.45),
        ("pointwise+ctriplet", "bm25", "100"): (baseline + cancel, zs_baseline, 0.42),
        ("pointwise", "none", "200"): (baseline + 0.02, zs_baseline + 0.01, 0.41),
    }
    experiment = tracker.experiment_id(sweep.name)
    written = [cells[k] for k in values] + [cells[("pointwise+scl", "bm25", "200")]]
    runs = _cell_runs(tracker, experiment, sweep, written)
    for key, (test, zero_shot, validation) in values.items():
        run_id = runs[cells[key].key]
        tracker.log_evaluation(run_id, "test_", _evaluation(test, QUERIES))
        tracker.log_evaluation(run_id, "zs_nfcorpus_test_", _evaluation(zero_shot, ZS_QUERIES))
        tracker.log_evaluation(run_id, "bm25_test_", _evaluation(FIRST_STAGE, QUERIES))
        tracker.log_metrics(run_id, {"best_val_ndcg_at_10": validation, "trials_complete": 1})
        chosen = {"learning_rate": 3e-05, **({"lambda_": validation - 0.1, "k": 2} if key[1] == "bm25" else {})}
        tracker.set_tags(run_id, {"winner_params": str(chosen)})  # as a sweep tags a cell with its winner's values
        tracker.finish(run_id)
    tracker.finish(runs[cells[("pointwise+scl", "bm25", "200")].key], "FAILED")
    config = work / "report-grid.yaml"

    config.write_text(yaml.safe_dump(SWEEP))
    return work, uri, tracker, sweep, runs, cells, values


def _results(store):
    _, _, tracker, sweep, *_ = store
    return load_sweep_results(sweep, tracker)


def _table(store, **kwargs):
    options = TableOptions(**kwargs)
    return grid_table(_results(store), "test_", "scifact", ("model", "size"), "augmentation", options)


def test_grid_table_values_relative_change_and_markers(store):
    *_, values = store
    table = _table(store)
    assert table.columns == ["BM25 (first stage)", "baseline", "bm25 / pointwise+scl", "linear / pointwise+scl",
                             "bm25 / pointwise+ctriplet", "linear / pointwise+ctriplet"]
    rows = {tuple(keys): entries for keys, entries in table.rows}
    first_stage, base, scl, scl_linear, ctriplet, _ = rows[("tiny", "100")]
    assert first_stage.value == pytest.approx(float(np.mean(FIRST_STAGE))) and first_stage.emphasis == ""
    assert first_stage.relative is None and first_stage.p_value is None
    expected_base = float(np.mean(values[("pointwise", "none", "100")][0]))
    expected_scl = float(np.mean(values[("pointwise+scl", "bm25", "100")][0]))
    assert base.value == pytest.approx(expected_base) and base.is_baseline and base.relative is None
    assert scl.value == pytest.approx(expected_scl)
    assert scl.relative == pytest.approx(100 * (expected_scl - expected_base) / expected_base)
    scipy_p = stats.ttest_rel(values[("pointwise+scl", "bm25", "100")][0], values[("pointwise", "none", "100")][0]).pvalue
    assert scl.p_value == pytest.approx(scipy_p) and scl.level == 0.05
    assert ctriplet.relative == pytest.approx(0.0, abs=1e-9) and ctriplet.level is None and ctriplet.p_value > 0.9
    assert scl_linear.value is None and scl_linear.status == "pending"  # runnable, never run: never a number
    # Emphasis: scl best, then ctriplet (whose mean equals the baseline's: they share "second").
    assert (scl.emphasis, ctriplet.emphasis, base.emphasis) == ("best", "second", "second")



def test_the_first_stage_column_is_named_by_the_first_stage_the_sweep_re_ranked(store):
    """A hybrid first stage's column is the hybrid's (was "BM25"); a zero-shot target's own first stage, its own."""
    hybrid = SweepSpec.model_validate({**SWEEP, "base": {**SWEEP["base"], "first_stage": {"method": "hybrid", "model": "minilm-l6"}},
                                       "zero_shot": [{"collection": "beir/nfcorpus", "first_stage": {"method": "bm25"}}]})
    results = dataclasses.replace(_results(store), sweep=hybrid)
    table = grid_table(results, "test_", "scifact", ("model", "size"), "augmentation", TableOptions())
    assert table.columns[0] == "hybrid (first stage)"
    assert "hybrid (first stage): the ranking every system re-ranks, for reference (not compared, not marked)." in table.notes
    assert grid_table(results, "zs_nfcorpus_test_", "nfcorpus", ("model",), "size", TableOptions()).columns[0] == "BM25 (first stage)"

def test_missing_and_failed_cells_are_shown_never_as_zero(store):
    table = _table(store)
    rows = {tuple(keys): entries for keys, entries in table.rows}
    _, base, scl, _, ctriplet, _ = rows[("tiny", "200")]
    assert scl.value is None and scl.status == "failed"
    assert ctriplet.value is None and ctriplet.status == "pending"
    assert base.emphasis == "best"  # the only number of the row

    md = render_markdown(table)
    row200 = next(line for line in md.splitlines() if line.startswith("| tiny | 200 |"))
    assert "failed" in row200 and "pending" in row200 and " 0.0000" not in row200
    records = list(csv.DictReader(io.StringIO(render_csv(table))))
    assert {r["status"] for r in records if r["size"] == "200" and r["column"] not in ("baseline", "BM25 (first stage)")} == {
        "failed", "pending"}
    assert all(r["value"] == "" for r in records if r["status"] != "ok")


def test_markdown_bold_underline_and_markers(store):
    md = render_markdown(_table(store))
    row100 = next(line for line in md.splitlines() if line.startswith("| tiny | 100 |")).split(" | ")
    assert row100[2] == "0.8000"  # BM25, for reference: not bold although higher
    assert row100[4].startswith("**") and row100[4].endswith("†")  # scl: best and significant at 95%
    assert row100[6].startswith("<u>") and "(+0.0%)" in row100[6] and "†" not in row100[6]
    assert "paired two-sided t-test on 40 queries" in md


def test_latex_is_well_formed(store):
    tex = render_latex(_table(store))
    body = [line for line in tex.splitlines() if not line.startswith("%")]
    assert body[0] == r"\begin{tabular}{llrrrrrr}" and body[-1] == r"\end{tabular}"
    rows = [line for line in body if line.endswith(r"\\")]
    assert len(rows) == 3  # header + one line per table row
    for line in rows:
        assert line.count("&") == 7  # 8 columns
    text = "\n".join(body)
    unescaped = re.sub(r"\\[{}%_&#$]", "", text)
    assert unescaped.count("{") == unescaped.count("}")
    depth = 0
    for ch in unescaped:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert r"\textbf{" in text and r"\underline{" in text and r"$^{\dagger}$" in text and r"\%)" in text
    assert "pointwise+scl" in text and r"\textit{failed}" in text


def test_holm_correction_applies_across_the_table(store):
    plain = {tuple(k): e for k, e in _table(store).rows}[("tiny", "100")]
    holm = {tuple(k): e for k, e in _table(store, correction="holm").rows}[("tiny", "100")]
    # Two comparisons in the table (scl and ctriplet at size 100): the smaller p doubles.
    assert holm[2].p_value == pytest.approx(min(1.0, 2 * plain[2].p_value))
    assert holm[4].p_value == pytest.approx(max(holm[2].p_value, plain[4].p_value))


def test_inconsistent_store_is_an_error(store, tmp_path):
    _, uri, tracker, sweep, runs, cells, _ = store
    run_id = runs[cells[("pointwise+ctriplet", "bm25", "100")].key]
    original = tracker.client.get_run(run_id).data.metrics["test_ndcg_at_10"]
    tracker.log_metrics(run_id, {"test_ndcg_at_10": original + 0.01})  # the logged aggregate no longer matches
    try:
        with pytest.raises(InputError, match="inconsistent"):
            grid_table(load_sweep_results(sweep, tracker), "test_", "scifact", ("model", "size"), "augmentation", TableOptions())
    finally:
        tracker.log_metrics(run_id, {"test_ndcg_at_10": original})


def test_zero_shot_table_selects_on_validation(store):
    *_, values = store
    table = zero_shot_table(_results(store), TableOptions(), {})
    labels = [keys[0] for keys, _ in table.rows]
    assert labels == ["scifact", "  baseline", "nfcorpus", "  baseline", "average", "  baseline"]
    # Largest size with a finished non-baseline system is... none at 200 (failed, pending): missing, not a fallback.
    assert all(entries[0].status == "missing" for _, entries in table.rows)
    chosen = zero_shot_table(_results(store), TableOptions(), {"loss": "pointwise+scl", "augmentation": "bm25", "size": "100"})
    rows = {keys[0]: entries[0] for keys, entries in chosen.rows if not keys[0].startswith(" ")}
    zs_system = float(np.mean(values[("pointwise+scl", "bm25", "100")][1]))
    zs_base = float(np.mean(values[("pointwise", "none", "100")][1]))
    assert rows["nfcorpus"].value == pytest.approx(zs_system)
    assert rows["nfcorpus"].relative == pytest.approx(100 * (zs_system - zs_base) / zs_base)
    assert rows["nfcorpus"].level == 0.05  # a constant +0.05 on every query
    test_system = float(np.mean(values[("pointwise+scl", "bm25", "100")][0]))
    assert rows["average"].value == pytest.approx((test_system + zs_system) / 2)
    assert "average" in render_markdown(chosen)


def test_transfer_matrix(store):
    table = transfer_table([_results(store)], TableOptions(), {"loss": "pointwise+ctriplet", "size": "100",
                                                                 "augmentation": "bm25"})
    assert table.columns == ["scifact", "nfcorpus"] and table.rows[0][0] == ["scifact", "tiny"]
    assert [e.value is not None for e in table.rows[0][1]] == [True, True]


def test_compare_two_cells(store):
    _, _, tracker, _, runs, cells, values = store
    a = runs[cells[("pointwise", "none", "100")].key]
    b = runs[cells[("pointwise+scl", "bm25", "100")].key]
    result = compare_runs(tracker, a, b, top=3)
    ndcg = next(m for m in result["measures"] if m["metric"] == "ndcg_at_10")
    base, system = values[("pointwise", "none", "100")][0], values[("pointwise+scl", "bm25", "100")][0]
    assert ndcg["difference"] == pytest.approx(float(np.mean(system - base)))
    assert ndcg["p_value"] == pytest.approx(stats.ttest_rel(base, system).pvalue)
    deltas = system - base
    expected = [QUERIES[i] for i in np.argsort(-np.abs(deltas))[:3]]
    assert [q["query_id"] for q in result["most_changed"]] == expected
    zs = compare_runs(tracker, a, b, collection="nfcorpus")
    assert zs["queries"] == len(ZS_QUERIES)
    with pytest.raises(InputError, match="no such MLflow run"):
        compare_runs(tracker, a, "0" * 32)
    with pytest.raises(InputError, match="no per-query values for 'fiqa'"):
        compare_runs(tracker, a, b, collection="fiqa")


def _cli(work, *args):
    return run_cli(work, *args)


def test_report_cli_writes_tables_and_figures_and_logs_them(store):
    work, uri, tracker, sweep, *_ = store
    out = work / "reports"
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--out", str(out), "--zero-shot",
                "--select", "loss=pointwise+scl,augmentation=bm25,size=100", "--format", "latex", "--log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(r"\begin{tabular}") == 2  # grid and zero-shot tables
    written = sorted(p.name for p in (out / "report-grid").iterdir())
    assert "table-ndcg_at_10-scifact.md" in written and "zero-shot-ndcg_at_10-scifact.tex" in written
    assert {"winners.md", "winners.csv"} <= set(written) and "Winners' hyper-parameters (4 tested cells" in proc.stdout
    header = (out / "report-grid" / "winners.csv").read_text().splitlines()[0].split(",")
    assert header == ["model", "loss", "augmentation", "size", "seed", "learning_rate", "lambda", "k",
                      "best_val_ndcg_at_10", "trials_complete"]
    pngs = [p for p in (out / "report-grid").glob("*.png")]
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)

    experiment = tracker.client.get_experiment_by_name("report-grid")
    root = tracker.client.search_runs([experiment.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'sweep'")
    assert len(root) == 1
    logged = {os.path.basename(a.path) for a in tracker.client.list_artifacts(root[0].info.run_id, "report")}
    assert set(written) <= logged
    # the sweep run's description in the MLflow UI is the table (Markdown), BM25 beside it
    assert "| BM25 (first stage) |" in root[0].data.tags[NOTE_TAG] and "pointwise+scl" in root[0].data.tags[NOTE_TAG]


def test_winners_hyperparameters_carry_the_names_the_ui_compares(store):
    rows = winners(_results(store))
    assert len(rows) == 4  # the tested cells: neither the failed one nor those never run
    scl = next(r for r in rows if r["loss"] == "pointwise+scl")
    assert scl == {"model": "tiny", "loss": "pointwise+scl", "augmentation": "bm25", "size": "100", "seed": "13",
                   "learning_rate": "3e-05", "lambda": str(0.45 - 0.1), "k": "2", "best_val_ndcg_at_10": "0.4500",
                   "trials_complete": "1"}
    baseline = next(r for r in rows if r["loss"] == "pointwise" and r["size"] == "200")
    assert "lambda" not in baseline and baseline["learning_rate"] == "3e-05"


def test_report_cli_bad_input_is_one_line_exit_2(store):
    work, uri, *_ = store
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--metric", "ndcg@11", "--no-plots")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "unknown metric 'ndcg@11'" in proc.stderr
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", f"sqlite:///{work / 'empty.db'}")
    assert proc.returncode == 2 and "run the sweep first" in proc.stderr
    proc = _cli(work, "compare", "abc", "def", "--tracking-uri", uri, "--json")
    assert proc.returncode == 2 and "no such MLflow run" in proc.stderr


# ----------------------------------------------------------------------------- golden: no new option, no change

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _golden_cases(store):
    """The tables whose output at 617b804 (before seeds, intervals and families) is in golden/."""
    results = _results(store)
    return {
        "grid-default": grid_table(results, "test_", "scifact", ("model", "size"), "augmentation", TableOptions()),
        "grid-holm": grid_table(results, "test_", "scifact", ("model", "size"), "augmentation", TableOptions(correction="holm")),
        "grid-bonferroni-ap-loss": grid_table(results, "test_", "scifact", ("model", "augmentation"), "loss",
                                              TableOptions(metric="ap", correction="bonferroni", digits=3)),
        "grid-nfcorpus-wilcoxon": grid_table(results, "zs_nfcorpus_test_", "nfcorpus", ("model", "size"), "augmentation",
                                             TableOptions(test="wilcoxon")),
        "zero-shot-default": zero_shot_table(results, TableOptions(), {}),
        "zero-shot-select-holm": zero_shot_table(results, TableOptions(correction="holm"),
                                                 {"loss": "pointwise+scl", "augmentation": "bm25", "size": "100"}),
        "transfer": transfer_table([results], TableOptions(), {"loss": "pointwise+ctriplet", "size": "100", "augmentation": "bm25"}),
        "robustness": robustness_table(_reader(), [("mhl", "mhl"), ("mhl+tml", "tml"), ("not run", None)],
                                       ["typo", "contraction"], "t"),
    }


def _golden(name: str) -> str:
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read()


def test_tables_without_the_new_options_are_unchanged(store):
    """Every table, in every format, is what it was before seeds, intervals and families existed
    (golden/ was written by this code at 617b804 on this fixture, its means rewritten once when they
    became math.fsum's: the same files on Python 3.11, 3.12 and 3.13)."""
    for name, table in _golden_cases(store).items():
        for fmt, render in RENDERERS.items():
            assert render(table, 3 if "ap-loss" in name else 4) == _golden(f"{name}.{fmt}"), f"{name}.{fmt}"


@pytest.mark.parametrize("name,extra", [
    ("cli-default", []),
    ("cli-zero-shot-latex", ["--zero-shot", "--format", "latex", "--select", "loss=pointwise+scl,augmentation=bm25,size=100"]),
    ("cli-csv-holm", ["--format", "csv", "--correction", "holm"]),
])
def test_report_cli_without_the_new_options_prints_what_it_printed(store, name, extra):
    work, uri, *_ = store
    out = work / f"golden-{name}"
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--out", str(out), "--no-plots", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.replace(str(out), "<OUT>") == _golden(f"{name}.txt")


# ----------------------------------------------------------------------------- seeds, intervals, families


def _by_name(table, keys):
    return dict(zip(table.columns, {tuple(k): e for k, e in table.rows}[keys]))


def _relative(expected):
    """Equal to 1e-9 of ``expected``: the p-values here are ~1e-25, below pytest.approx's absolute tolerance."""
    return pytest.approx(expected, rel=1e-9, abs=0)


def _raw_p_values(values):
    """The fixture's four system-vs-baseline t-tests (test and nfcorpus; SCL and CTriplet at size 100)."""
    out = {}
    for loss in ("pointwise+scl", "pointwise+ctriplet"):
        for target, queries in ((0, QUERIES), (1, ZS_QUERIES)):
            system, base = values[(loss, "bm25", "100")][target], values[("pointwise", "none", "100")][target]
            out[(loss, target)] = paired_test(dict(zip(queries, system)), dict(zip(queries, base))).p_value
    return out


def test_ci_entries_hold_the_t_interval_direction_and_effect(store):
    *_, values = store
    row = _by_name(_table(store, ci=True), ("tiny", "100"))
    scl, ctriplet = row["bm25 / pointwise+scl"], row["bm25 / pointwise+ctriplet"]
    d = values[("pointwise+scl", "bm25", "100")][0] - values[("pointwise", "none", "100")][0]
    assert scl.ci == pytest.approx(_t_reference(d), abs=1e-12)  # one seed: scipy's paired t interval
    assert scl.difference == pytest.approx(d.mean()) and scl.effect == pytest.approx(d.mean() / d.std(ddof=1))
    assert (scl.direction.won, scl.direction.tied, scl.direction.lost) == (int((d > 0).sum()), 0, int((d < 0).sum()))
    assert (ctriplet.direction.won, ctriplet.direction.tied, ctriplet.direction.lost) == (20, 0, 20)  # +0.05, -0.05, ...
    assert ctriplet.ci[0] < 0 < ctriplet.ci[1]
    relative = row["bm25 / pointwise+scl"].relative_ci
    base = float(np.mean(values[("pointwise", "none", "100")][0]))
    assert relative == pytest.approx((100 * scl.ci[0] / base, 100 * scl.ci[1] / base))
    assert _table(store).rows[0][1][2].ci is None  # intervals only when asked for


def _family_size(note_text: str, scope: str) -> int:
    match = re.search(rf"the family is {scope}: (\d+) comparisons", note_text)
    assert match, note_text
    return int(match.group(1))


def test_the_family_size_printed_is_the_number_of_comparisons_made(store, monkeypatch):
    made = set()
    original = tables.paired_test

    def counting(a, b, *args, **kwargs):
        made.add((tuple(sorted(a.items())), tuple(sorted(b.items()))))
        return original(a, b, *args, **kwargs)

    monkeypatch.setattr(tables, "paired_test", counting)
    sweep = render_markdown(_table(store, family="sweep", correction="holm"))
    assert _family_size(sweep, "the sweep") == len(made) == 4  # SCL and CTriplet at size 100, on scifact and nfcorpus
    assert "Holm-corrected over the sweep's 4 comparisons" in sweep
    made.clear()
    table = render_markdown(_table(store, family="table", correction="bonferroni"))
    assert _family_size(table, "this table") == len(made) == 2
    assert "Bonferroni's correction (family-wise error rate)" in table


def test_sweep_family_corrects_every_table_over_all_comparisons(store):
    *_, values = store
    raw = _raw_p_values(values)
    ordered = sorted(raw.values())
    m = len(ordered)
    # Benjamini-Hochberg by hand: m / rank * p, the running minimum from the largest
    bh = {p: min(min(1.0, m / (j + 1) * ordered[j]) for j in range(i, m)) for i, p in enumerate(ordered)}
    row = _by_name(_table(store, family="sweep", correction="bh"), ("tiny", "100"))
    assert row["bm25 / pointwise+scl"].p_value == _relative(bh[raw[("pointwise+scl", 0)]])
    assert row["bm25 / pointwise+scl"].raw_p_value == _relative(raw[("pointwise+scl", 0)])
    # Holm: the sweep's 4 p-values are 0 (nfcorpus SCL: a constant gain), p, 1, 1: the second smallest times 3;
    # in the table's family (p, 1) it is times 2
    p = raw[("pointwise+scl", 0)]
    assert sorted(raw.values())[:2] == [0.0, p]
    holm = _by_name(_table(store, family="sweep", correction="holm"), ("tiny", "100"))["bm25 / pointwise+scl"]
    assert holm.p_value == _relative(3 * p)
    assert _by_name(_table(store, correction="holm"), ("tiny", "100"))["bm25 / pointwise+scl"].p_value == _relative(2 * p)
    zero_shot = zero_shot_table(_results(store), TableOptions(family="sweep", correction="bh", ci=True),
                                {"loss": "pointwise+scl", "augmentation": "bm25", "size": "100"})
    rows = {keys[0]: entries[0] for keys, entries in zero_shot.rows}
    assert rows["scifact"].p_value == _relative(bh[raw[("pointwise+scl", 0)]])
    assert rows["nfcorpus"].p_value == _relative(bh[raw[("pointwise+scl", 1)]])
    assert rows["nfcorpus"].ci == _relative((0.05, 0.05))  # a constant +0.05 on every query
    assert any("the family is the sweep: 4 comparisons" in n for n in zero_shot.notes)


def test_report_cli_ci_family_sweep_bh_prints_intervals_direction_and_the_family(store):
    """The issue's 'done when': intervals, won/tied/lost and the family note, in every format."""
    work, uri, *_, values = store
    d = values[("pointwise+scl", "bm25", "100")][0] - values[("pointwise", "none", "100")][0]
    low, high = _t_reference(d)  # BH: the interval stays at 95% (the legend says so)
    interval = f"[{low:+.4f}, {high:+.4f}]"
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--out", str(work / "ci"),
                "--ci", "--family", "sweep", "--correction", "bh")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"**0.4700** (+19.9%)† {interval}" in out
    assert f"| tiny | 100 | bm25 / pointwise+scl | {d.mean():+.4f} | {interval} | 40 / 0 / 0 |" in out
    assert "| tiny | 100 | bm25 / pointwise+ctriplet | +0.0000 |" in out and "| 20 / 0 / 20 |" in out
    assert "Benjamini-Hochberg-corrected over the sweep's 4 comparisons" in out
    assert "the family is the sweep: 4 comparisons" in out and "false discovery rate" in out
    records = list(csv.DictReader(io.StringIO((work / "ci" / "report-grid" / "table-ndcg_at_10-scifact.csv").read_text())))
    scl = next(r for r in records if r["size"] == "100" and r["column"] == "bm25 / pointwise+scl")
    assert float(scl["ci_low"]) == pytest.approx(low) and float(scl["ci_high"]) == pytest.approx(high)
    assert (scl["won"], scl["tied"], scl["lost"]) == ("40", "0", "0")
    assert float(scl["effect_size"]) == pytest.approx(d.mean() / d.std(ddof=1))
    raw = _raw_p_values(values)
    assert float(scl["p_value_uncorrected"]) == _relative(raw[("pointwise+scl", 0)])
    assert float(scl["p_value"]) == _relative(2 * raw[("pointwise+scl", 0)])  # BH over the sweep's 4: p_(2) x 4 / 2
    tex = (work / "ci" / "report-grid" / "table-ndcg_at_10-scifact.tex").read_text()
    assert r"{\small" + interval + "}" in tex and tex.count(r"\begin{tabular}") == 2  # the table and its comparisons
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--family", "whole", "--no-plots")
    assert proc.returncode == 2 and "invalid choice: 'whole'" in proc.stderr


def test_compare_always_shows_the_interval_direction_and_effect(store):
    _, _, tracker, _, runs, cells, values = store
    a = runs[cells[("pointwise", "none", "100")].key]
    b = runs[cells[("pointwise+scl", "bm25", "100")].key]
    result = compare_runs(tracker, a, b)
    ndcg = next(m for m in result["measures"] if m["metric"] == "ndcg_at_10")
    d = values[("pointwise+scl", "bm25", "100")][0] - values[("pointwise", "none", "100")][0]  # B - A
    assert (ndcg["ci_low"], ndcg["ci_high"]) == pytest.approx(_t_reference(d), abs=1e-12)
    assert (ndcg["won"], ndcg["tied"], ndcg["lost"]) == (40, 0, 0) and ndcg["ci_low"] > 0
    assert ndcg["effect_size"] == pytest.approx(d.mean() / d.std(ddof=1), abs=1e-9)
    text = format_comparison(result)
    assert f"[{ndcg['ci_low']:+.4f}, {ndcg['ci_high']:+.4f}]" in text and "40/0/0" in text


def test_relative_figure_draws_the_intervals_as_error_bars(store, tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)  # keep the figure to look at its bars
    all_systems = systems(_results(store), "ndcg_at_10", "test_")
    for ci in (False, True):
        entries = compare_with_baselines(all_systems, "t", "none", ci=ci)
        plots.plot_relative_by_size(all_systems, entries, "tiny", "ndcg_at_10", "scifact", tmp_path / f"r{ci}.png")
    bars = [[c for c in f.axes[0].containers if hasattr(c, "errorbar")] for f in figures]
    assert all(c.errorbar is None for c in bars[0])
    with_bars = [c for c in bars[1] if c.errorbar is not None]
    assert len(with_bars) == 2  # SCL and CTriplet at size 100
    scl = next(e for s, e in ((s, entries[id(s)]) for s in all_systems) if s.axes["loss"] == "pointwise+scl"
               and s.axes["size"] == "100")
    segments = with_bars[0].errorbar.lines[2][0].get_segments()
    assert segments[0][:, 1] == pytest.approx(list(scl.relative_ci))  # from the interval's low to its high end
