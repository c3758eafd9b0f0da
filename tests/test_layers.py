"""The data plane stands alone: every ``workloads`` module imports without the control plane
(``orchestrator``) and without Ray, MLflow or Optuna, so a workload runs and is tested without them."""

import subprocess
import sys

CONTROL_PLANE = ("orchestrator", "ray", "mlflow", "optuna")

PROBE = f"""
import importlib, pkgutil, sys
import workloads
names = [m.name for m in pkgutil.walk_packages(workloads.__path__, "workloads.")]
for name in names:
    importlib.import_module(name)
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({CONTROL_PLANE!r}))
print(len(names), ",".join(loaded))
"""


def test_every_workloads_module_imports_without_the_control_plane():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, loaded = proc.stdout.strip().split(" ", 1) if " " in proc.stdout.strip() else (proc.stdout.strip(), "")
    assert int(count) > 30  # every module was imported, not an empty package
    assert loaded == "", f"workloads imports {loaded}"
