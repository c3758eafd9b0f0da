"""``benchmarks/learning_curve.py``: the trials it derives and the order it runs them in (the
runs themselves are measurements, not tests)."""

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import yaml

from workloads.kinds.rerank.spec import TrialSpec

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import learning_curve  # noqa: E402  (benchmarks/ is not a package)


def test_a_size_trial_is_trial_scifact_with_only_its_knobs_changed():
    knobs = Namespace(max_length=128, test_depth=10)
    derived = learning_curve.trial_config("lc-500", 500, 1, "fp32", knobs)
    base = yaml.safe_load((REPO / "search_spaces" / "trials" / "trial-scifact.yaml").read_text())
    spec = TrialSpec.model_validate(derived)
    assert (spec.training_data.size, spec.optimization.epochs, spec.optimization.precision) == (500, 1, "fp32")
    assert (spec.model.max_length, spec.first_stage.test_depth, spec.reranking.interpolation) == (128, 10, "tuned")
    assert spec.loss.ranking == "pointwise" and spec.model.name == "minilm-l6"
    for changed, key in ((derived, "name"), (base, "name")):
        changed.pop(key)
    base["training_data"]["size"], base["model"]["max_length"], base["first_stage"]["test_depth"] = 500, 128, 10
    base["optimization"] |= {"epochs": 1, "precision": "fp32"}
    assert derived == base  # everything else (depths, seeds, validation queries, learning rate) is trial-scifact's


def test_sizes_run_smallest_first_and_the_timing_pair_once_the_curve_reaches_its_size():
    assert learning_curve.steps([2000, 250, 1000, 500], 500) == [
        ("curve", 250), ("curve", 500), ("timing", "fp32"), ("timing", "bf16"), ("curve", 1000), ("curve", 2000)]
    assert learning_curve.steps([1000], 0) == [("curve", 1000)]
    assert learning_curve.steps([], 500) == [("timing", "fp32"), ("timing", "bf16")]


def test_a_bad_option_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "learning_curve.py"), "--epochs", "0",
                           "--workdir", str(tmp_path / "w")], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "--epochs at least 1" in proc.stderr.splitlines()[-1]
    assert not (tmp_path / "w").exists()  # nothing written
