"""A sweep whose final ranking fuses the cross-encoder with BM25: the report's block of each
system fused and alone beside BM25, the fused ranking's difference from BM25 and from its
baseline with their intervals, and the sentence beneath (a store written as a sweep writes it)."""

import csv
import io
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from orchestrator.core.tracking import Tracker
from orchestrator.report.build import ReportRequest, build_report
from orchestrator.report.first_stage import FirstStageComparison, SystemAgainstFirstStage, compare_with_first_stage, summary_sentence
from orchestrator.report.results import load_sweep_results
from orchestrator.report.tables import TableOptions
from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.runner import _cell_runs
from tests.report.test_report import QUERIES, _evaluation
from tests.workloads.evaluation.test_statistics import _crossed_reference
from workloads.evaluation.statistics import Direction, Interval, SeedSummary, Uncertainty

FUSED = {
    "name": "fused",
    "base": {"data": {"collection": "beir/scifact"}, "reranking": {"interpolation": "tuned"}},
    "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
             "augmentations": [{"method": "bm25", "k": 2}], "sizes": [500], "seeds": [13, 14]},
    "search": {"trials_per_cell": 1},
}
SEEDS = ("13", "14")


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    work = tmp_path_factory.mktemp("fused")
    tracker = Tracker(f"sqlite:///{work / 'mlflow.db'}")
    sweep = SweepSpec.model_validate(FUSED)
    cells = {(c.axes["loss"], c.axes["seed"]): c for c in expand_grid(sweep)}
    rng = np.random.default_rng(11)
    bm25 = rng.uniform(0.4, 0.8, len(QUERIES))
    fused = {("pointwise", "13"): bm25 + 0.03 + rng.normal(0, 0.02, len(QUERIES)),
             ("pointwise", "14"): bm25 + 0.028 + rng.normal(0, 0.02, len(QUERIES)),
             ("pointwise+scl", "13"): bm25 + 0.01 + rng.normal(0, 0.05, len(QUERIES)),  # no better than BM25, clearly
             ("pointwise+scl", "14"): bm25 - 0.01 + rng.normal(0, 0.05, len(QUERIES))}
    alone = {key: values - 0.2 for key, values in fused.items()}  # the cross-encoder alone: below BM25
    runs = _cell_runs(tracker, tracker.experiment_id(sweep.name), sweep, list(cells.values()))
    for key, values in fused.items():
        run_id = runs[cells[key].key]
        tracker.log_evaluation(run_id, "test_", _evaluation(values, QUERIES))
        tracker.log_evaluation(run_id, "test_cross_encoder_", _evaluation(alone[key], QUERIES))
        tracker.log_evaluation(run_id, "bm25_test_", _evaluation(bm25, QUERIES))
        tracker.log_metrics(run_id, {"best_val_ndcg_at_10": 0.5, "trials_complete": 1,
                                     "test_interpolation_weight": 0.3 if key[1] == "13" else 0.4})
        tracker.finish(run_id)
    (work / "fused.yaml").write_text(yaml.safe_dump(FUSED))
    return work, tracker, sweep, bm25, fused, alone


def test_each_system_against_bm25_fused_and_alone_with_intervals(fused):
    _, tracker, sweep, bm25, values, alone = fused
    comparison = compare_with_first_stage(load_sweep_results(sweep, tracker), "test_", "ndcg_at_10")
    assert comparison.first_stage == "BM25" and comparison.queries == len(QUERIES)
    assert comparison.first_stage_value == pytest.approx(bm25.mean())
    rows = {r.label: r for r in comparison.rows}
    assert set(rows) == {"baseline", "bm25 / pointwise+scl"}
    for loss, label in (("pointwise", "baseline"), ("pointwise+scl", "bm25 / pointwise+scl")):
        row = rows[label]
        means = [values[(loss, s)].mean() for s in SEEDS]
        assert row.fused.mean == pytest.approx(np.mean(means)) and row.fused.std == pytest.approx(abs(means[0] - means[1]) / np.sqrt(2))
        assert row.alone.mean == pytest.approx(np.mean(means) - 0.2)
        assert row.weight == pytest.approx(0.35)
        d = np.vstack([values[(loss, s)] - bm25 for s in SEEDS])  # BM25 is the same ranking for every seed
        assert row.against_first_stage.difference == pytest.approx(d.mean())
        interval = row.against_first_stage.interval
        assert (interval.low, interval.high) == pytest.approx(_crossed_reference(d), abs=1e-12)
    d = np.vstack([values[("pointwise+scl", s)] - values[("pointwise", s)] for s in SEEDS])
    versus = rows["bm25 / pointwise+scl"].against_baseline.interval
    assert (versus.low, versus.high) == pytest.approx(_crossed_reference(d), abs=1e-12)
    assert rows["baseline"].against_baseline is None
    assert rows["baseline"].against_first_stage.interval.low > 0  # the fixture's premise: the baseline beats BM25


def test_the_report_prints_the_block_with_a_sentence_and_writes_it(fused):
    work, tracker, sweep, bm25, values, _ = fused
    options = TableOptions()
    output = build_report([sweep], tracker, work / "reports", ReportRequest(options, plots=False))
    comparison = compare_with_first_stage(load_sweep_results(sweep, tracker), "test_", "ndcg_at_10")
    best = next(r for r in comparison.rows if r.label == "baseline")
    u = best.against_first_stage
    assert "| BM25 (first stage) | " + f"{bm25.mean():.4f}" in output.text
    assert "| system | fused with BM25 | fused - BM25 [95% interval] | cross-encoder alone | weight |" in output.text
    sentence = (f"Fused with BM25, 1 of 2 systems ranks better than BM25 alone (nDCG@10 {bm25.mean():.4f}) with a 95% "
                f"interval above zero; the highest, baseline, reaches {best.fused.mean:.4f}: {u.difference:+.4f} "
                f"[{u.interval.low:+.4f}, {u.interval.high:+.4f}] over 2 seeds x 40 queries.")
    assert sentence in output.text
    assert "The cross-encoder alone reaches" in output.text and "below BM25: the gain comes from fusing" in output.text
    assert "not corrected for the block's 3 comparisons" in output.text  # 2 against BM25, 1 against the baseline
    assert "Against the baseline (fused too): bm25 / pointwise+scl" in output.text
    written = work / "reports" / "fused" / "first-stage-ndcg_at_10-scifact.csv"
    assert written in output.files and (written.with_suffix(".md")).read_text() in output.text
    assert len({len(row) for row in csv.reader(io.StringIO(written.read_text()))}) == 1  # every row as wide as the header
    records = list(csv.DictReader(io.StringIO(written.read_text())))
    assert records[0]["system"] == "BM25 (first stage)" and float(records[0]["fused"]) == pytest.approx(bm25.mean())
    assert float(records[1]["ci_low"]) == pytest.approx(u.interval.low, abs=1e-12) and records[1]["seeds"] == "2"


def test_a_sweep_that_does_not_fuse_has_no_such_block(fused, tmp_path):
    """Without the cross-encoder's own values (its final ranking is the cross-encoder's) the report
    is what it was: the golden files of tests/report/ hold that."""
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep = SweepSpec.model_validate({**FUSED, "name": "plain", "base": {"data": {"collection": "beir/scifact"}}})
    cells = list(expand_grid(sweep))
    runs = _cell_runs(tracker, tracker.experiment_id(sweep.name), sweep, cells)
    for cell in cells:
        tracker.log_evaluation(runs[cell.key], "test_", _evaluation(np.full(len(QUERIES), 0.5), QUERIES))
        tracker.log_evaluation(runs[cell.key], "bm25_test_", _evaluation(np.full(len(QUERIES), 0.4), QUERIES))
        tracker.finish(runs[cell.key])
    assert compare_with_first_stage(load_sweep_results(sweep, tracker), "test_", "ndcg_at_10") is None


def test_the_sentence_claims_no_gain_where_no_fused_system_beats_bm25():
    """Every fused system's interval below BM25's: the sentence says fusing lifted none above it."""
    def row(label, fused, low, high, baseline=None):
        system = SimpleNamespace(is_baseline=baseline is None, axes={})
        return SystemAgainstFirstStage(label, system, SeedSummary(fused, None, 1), SeedSummary(0.3, None, 1), 0.2,
                                       Uncertainty(fused - 0.6, Interval(low, high, 0.95, 300, 1), Direction(0, 0, 300), -1.0),
                                       baseline)
    comparison = FirstStageComparison("BM25", 0.6, 300, [row("baseline", 0.58, -0.03, -0.01), row("scl", 0.59, -0.02, +0.001)])
    sentence = summary_sentence(comparison, "ndcg_at_10")
    assert sentence.startswith("Fused with BM25, 0 of 2 systems rank better than BM25 alone (nDCG@10 0.6000) with a 95% "
                               "interval above zero (1 below it); the highest, scl, reaches 0.5900")
    assert "over 1 seed x 300 queries" in sentence
    assert "did not lift any system clearly above BM25" in sentence and "the gain comes from" not in sentence
