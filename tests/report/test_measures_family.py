"""``report --family sweep --measures``: one correction over every comparison on several measures."""

from __future__ import annotations

import pytest

from orchestrator.report.tables import TableOptions, grid_table
from tests.report.test_report import _by_name, _cli, _raw_p_values, _relative, _results, store  # noqa: F401  (the fixture)


def _scl(report, correction: str, metric: str):
    options = TableOptions(metric=metric, family="sweep", correction=correction, measures=("ndcg_at_10", "ap"))
    table = grid_table(_results(report), "test_", "scifact", ("model", "size"), "augmentation", options)
    return table, _by_name(table, ("tiny", "100"))["bm25 / pointwise+scl"]


@pytest.mark.parametrize("metric", ["ndcg_at_10", "ap"])
def test_holm_and_bonferroni_correct_over_both_measures_together(store, metric):  # noqa: F811
    *_, values = store
    # per measure the sweep's 4 raw p-values are 0 (nfcorpus SCL: a constant gain), p, 1, 1; AP is nDCG / 2 on every
    # query here, so its t-tests give the same p: the family of 8 is 0, 0, p, p, 1, 1, 1, 1
    p = _raw_p_values(values)[("pointwise+scl", 0)]
    # Holm by hand: p is the 3rd smallest of 8 -> (8 - 2) p, and the 4th's (8 - 3) p does not exceed it
    _, holm = _scl(store, "holm", metric)
    assert holm.p_value == _relative(6 * p) and holm.raw_p_value == _relative(p)
    table, bonferroni = _scl(store, "bonferroni", metric)
    assert bonferroni.p_value == _relative(8 * p)
    assert any("the family is the sweep: 8 comparisons (each system against its baseline on nDCG@10 and AP" in n
               for n in table.notes)


def test_report_cli_measures_prints_a_table_per_measure_and_one_family(store):  # noqa: F811
    work, uri, *_ = store
    out = work / "measures"
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--out", str(out), "--no-plots",
                "--family", "sweep", "--correction", "holm", "--measures", "ndcg@10,ap")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("the family is the sweep: 8 comparisons") == 2
    assert sorted(p.name for p in (out / "report-grid").glob("table-*.csv")) == ["table-ap-scifact.csv",
                                                                                 "table-ndcg_at_10-scifact.csv"]


@pytest.mark.parametrize(("extra", "message"), [
    (("--measures", "ndcg@10,ap"), "--measures: a family over several measures needs --family sweep"),
    (("--family", "sweep", "--measures", "ndcg@10,bleu"), "--measures: unknown metric 'bleu'"),
])
def test_report_cli_measures_bad_input_is_one_line(store, extra, message):  # noqa: F811
    work, uri, *_ = store
    out = work / "measures-bad"
    proc = _cli(work, "report", str(work / "report-grid.yaml"), "--tracking-uri", uri, "--out", str(out), *extra)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()  # nothing half-written
