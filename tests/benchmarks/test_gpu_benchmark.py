"""``benchmarks/gpu_throughput.py`` runs where the project is not installed (a GPU image with
torch, transformers and pyarrow, no pydantic or ir_measures) and writes profiles the cost
estimate reads."""

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.sweep.estimate import load_throughputs

REPO = Path(__file__).resolve().parents[2]
BLOCKED = ("pydantic", "ir_measures", "orchestrator", "ray", "mlflow")

RUN = """
import runpy, sys
for name in {blocked!r}:
    sys.modules[name] = None  # importing it raises ImportError, as where it is not installed
sys.argv = ["gpu_throughput.py", *{argv!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as exc:
    sys.exit(exc.code)
"""


def test_the_gpu_benchmark_smoke_runs_without_pydantic_and_writes_estimate_profiles(tmp_path):
    out = tmp_path / "gpu.json"
    argv = ["--smoke", "--device", "cpu", "--no-st", "--models", "distilbert", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    code = RUN.format(blocked=BLOCKED, argv=argv, script=str(REPO / "benchmarks" / "gpu_throughput.py"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    (row,) = results["rows"]
    eager = row["ours"]["eager"]
    assert row["model"] == "distilbert" and row["tokens"] == 32 and row["batch"] == 4
    assert eager["pairs_per_s"] > 0 and eager["scoring_pairs_per_s"] > 0 and eager["padded_length"] == 32
    assert set(eager["phase_ms"]) == {"input", "forward", "backward", "clip", "optimizer", "sync"}
    assert eager["launches_per_step"] > 100 and eager["launch_unit"] == "torch operators"
    assert row["sentence_transformers"] == {"skipped": "--no-st"}


    profiles = load_throughputs(tmp_path / "gpu.profiles.json")
    profile = profiles["smoke-distilbert-32-b4-eager"]
    assert profile.model == "distilbert-base-uncased" and profile.tokens == 32 and not profile.measured
    assert profile.train_pairs_per_second == round(eager["pairs_per_s"], 3)
    assert profile.source.startswith("smoke run with tiny models: not a measurement")
