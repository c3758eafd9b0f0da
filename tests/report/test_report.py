"""Reports, comparisons and figures on an MLflow store written the way a sweep writes it.

The store is constructed (no training): a grid of 10 cells where, at size 100, SCL is a
consistent gain over the baseline (significant) and CTriplet gains and losses cancel (not
significant); at size 200 SCL failed and CTriplet never ran; the linear-selector cells never
ran (pending). Every expectation below follows from that construction.
"""

import csv
import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from orchestrator.sweep.grid import SweepSpec, expand_grid
from workloads.errors import InputError
from workloads.evaluation import Evaluation

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
    from orchestrator.core.tracking import Tracker
    from orchestrator.sweep.runner import _cell_runs

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
    import yaml

    config.write_text(yaml.safe_dump(SWEEP))
    return work, uri, tracker, sweep, runs, cells, values


def _results(store):
    from orchestrator.report.results import load_sweep_results

    _, _, tracker, sweep, *_ = store
    return load_sweep_results(sweep, tracker)


def _table(store, **kwargs):
    from orchestrator.report.tables import TableOptions, grid_table

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


def test_missing_and_failed_cells_are_shown_never_as_zero(store):
    table = _table(store)
    rows = {tuple(keys): entries for keys, entries in table.rows}
    _, base, scl, _, ctriplet, _ = rows[("tiny", "200")]
    assert scl.value is None and scl.status == "failed"
    assert ctriplet.value is None and ctriplet.status == "pending"
    assert base.emphasis == "best"  # the only number of the row
    from orchestrator.report.tables import render_csv, render_markdown

    md = render_markdown(table)
    row200 = next(line for line in md.splitlines() if line.startswith("| tiny | 200 |"))
    assert "failed" in row200 and "pending" in row200 and " 0.0000" not in row200
    records = list(csv.DictReader(io.StringIO(render_csv(table))))
    assert {r["status"] for r in records if r["size"] == "200" and r["column"] not in ("baseline", "BM25 (first stage)")} == {
        "failed", "pending"}
    assert all(r["value"] == "" for r in records if r["status"] != "ok")


def test_markdown_bold_underline_and_markers(store):
    from orchestrator.report.tables import render_markdown

    md = render_markdown(_table(store))
    row100 = next(line for line in md.splitlines() if line.startswith("| tiny | 100 |")).split(" | ")
    assert row100[2] == "0.8000"  # BM25, for reference: not bold although higher
    assert row100[4].startswith("**") and row100[4].endswith("†")  # scl: best and significant at 95%
    assert row100[6].startswith("<u>") and "(+0.0%)" in row100[6] and "†" not in row100[6]
    assert "paired two-sided t-test on 40 queries" in md


def test_latex_is_well_formed(store):
    from orchestrator.report.tables import render_latex

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
    from orchestrator.report.results import load_sweep_results
    from orchestrator.report.tables import TableOptions, grid_table

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
    from orchestrator.report.tables import TableOptions, render_markdown, zero_shot_table

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
    from orchestrator.report.tables import TableOptions, transfer_table

    table = transfer_table([_results(store)], TableOptions(), {"loss": "pointwise+ctriplet", "size": "100",
                                                                 "augmentation": "bm25"})
    assert table.columns == ["scifact", "nfcorpus"] and table.rows[0][0] == ["scifact", "tiny"]
    assert [e.value is not None for e in table.rows[0][1]] == [True, True]


def test_compare_two_cells(store):
    from orchestrator.report.compare import compare_runs

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
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=work, capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


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
    from orchestrator.core.schema import KIND_TAG, NOTE_TAG

    experiment = tracker.client.get_experiment_by_name("report-grid")
    root = tracker.client.search_runs([experiment.experiment_id], filter_string=f"tags.`{KIND_TAG}` = 'sweep'")
    assert len(root) == 1
    logged = {os.path.basename(a.path) for a in tracker.client.list_artifacts(root[0].info.run_id, "report")}
    assert set(written) <= logged
    # the sweep run's description in the MLflow UI is the table (Markdown), BM25 beside it
    assert "| BM25 (first stage) |" in root[0].data.tags[NOTE_TAG] and "pointwise+scl" in root[0].data.tags[NOTE_TAG]


def test_winners_hyperparameters_carry_the_names_the_ui_compares(store):
    from orchestrator.report.results import winners

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
