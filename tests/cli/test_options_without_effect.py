"""Options that were accepted and had no effect (issue 59): each is refused at validation in one
line naming the file, its line and the option, exit 2, before any work."""

from pathlib import Path

import yaml

from tests.cli.test_offline import assert_one_clear_line
from tests.helpers import run_cli


def _write(tmp_path: Path, name: str, config: dict) -> Path:
    (tmp_path / name).write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp_path / name


def _trial(tmp_path: Path, **changes) -> Path:
    config = {"name": "t", "data": {"collection": "beir/scifact", "validation_queries": 5}, "model": {"name": "minilm-l6"}}
    return _write(tmp_path, "t.yaml", {**config, **changes})


def test_margin_mse_without_mining_is_refused(tmp_path):
    # no row would carry a teacher's score: the loss is 0 throughout and nothing is learned
    trial = _trial(tmp_path, loss={"ranking": "margin_mse"})
    assert_one_clear_line(run_cli(tmp_path, "run", str(trial), "--dry-run"), "t.yaml:1: ",
                          "loss margin_mse regresses on a teacher's scores, which only mined negatives carry: "
                          "set training_data.mining")


def test_a_fusion_weight_with_rrf_is_refused(tmp_path):
    trial = _trial(tmp_path, first_stage={"method": "hybrid", "model": "minilm-l6", "fusion_weight": 0.3})
    assert_one_clear_line(run_cli(tmp_path, "run", str(trial), "--dry-run"), "t.yaml:7: first_stage: ",
                          "fusion_weight weighs an interpolation of the scores: it has no effect with fusion rrf")


def test_an_rrf_k_with_interpolation_is_refused(tmp_path):
    trial = _trial(tmp_path, first_stage={"method": "hybrid", "model": "minilm-l6", "fusion": "interpolation",
                                          "fusion_weight": 0.3, "rrf_k": 10})
    assert_one_clear_line(run_cli(tmp_path, "run", str(trial), "--dry-run"), "t.yaml:7: first_stage: ",
                          "rrf_k is reciprocal rank fusion's constant: it has no effect with fusion interpolation")


def _sweep(tmp_path: Path, **search) -> Path:
    return _write(tmp_path, "s.yaml", {
        "name": "s", "base": {"data": {"collection": "beir/scifact"}},
        "grid": {"models": ["minilm-l6"], "losses": [{"ranking": "pointwise"}], "augmentations": [{"method": "none"}],
                 "sizes": [100]},
        "search": {"trials_per_cell": 1, **search}})


def test_a_wilcoxon_p_with_the_median_pruner_is_refused(tmp_path):
    sweep = _sweep(tmp_path, pruner="median", wilcoxon_p=0.05)
    assert_one_clear_line(run_cli(tmp_path, "sweep", str(sweep), "--dry-run"), "s.yaml:", "search: ",
                          "wilcoxon_p is the wilcoxon pruner's setting: it has no effect with pruner 'median'")


def test_pruner_startup_trials_with_the_wilcoxon_pruner_is_refused(tmp_path):
    sweep = _sweep(tmp_path, pruner_startup_trials=1)  # the default pruner: wilcoxon
    assert_one_clear_line(run_cli(tmp_path, "sweep", str(sweep), "--dry-run"), "s.yaml:", "search: ",
                          "pruner_startup_trials is the median pruner's setting: it has no effect with pruner 'wilcoxon'")
