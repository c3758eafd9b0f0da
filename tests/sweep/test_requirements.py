"""A sweep's required trials (selectors) train at once, each cell waits for its own, and a failed
one fails only its own cells; Ray and MLflow are stood in for (the end-to-end run is in
test_selector_sweep.py)."""

import threading
from pathlib import Path
from types import SimpleNamespace

from orchestrator.core.interrupts import Interruption
from orchestrator.sweep import runner
from orchestrator.sweep.grid import SweepSpec, expand_grid

SELECTOR = {"epochs": 1, "batch_size": 8}
SWEEP = {"name": "s", "base": {"data": {"collection": "beir/scifact"}},
         "grid": {"models": ["m"], "losses": [{"ranking": "pointwise"}], "sizes": [100],
                  "augmentations": [{"method": "none"}, {"method": "linear", "k": 1, "selector": {"k": 2, **SELECTOR}},
                                    {"method": "linear", "k": 1, "selector": {"k": 3, **SELECTOR}}]},
         "search": {"trials_per_cell": 1, "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}}}


def test_selectors_train_at_once_and_a_failed_one_fails_only_its_cells(monkeypatch, tmp_path):
    sweep = SweepSpec.model_validate(SWEEP)
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    supervised = [c for c in cells if c.requirements]
    assert len(cells) == 3 and len(supervised) == 2
    together = threading.Barrier(2, timeout=20)  # both selectors must be in training at the same time
    prepared_cells: list[str] = []

    def ensure_requirement(required, *args, **kwargs) -> Path:
        together.wait()
        if required.selector.k == 2:
            raise RuntimeError("selector diverged")
        return tmp_path / required.name

    monkeypatch.setattr(runner, "ensure_requirement", ensure_requirement)
    monkeypatch.setattr(runner, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(runner, "check_resources", lambda *a, **k: None)
    monkeypatch.setattr(runner, "_prepare_cells", lambda sweep, users, prepared: prepared_cells.extend(c.key for c in users))
    monkeypatch.setattr(runner, "_log_data_stats", lambda *a: None)
    tracker = SimpleNamespace(sweep_run=lambda *a: "root")
    paths = SimpleNamespace(ray_storage=tmp_path)
    interruption = Interruption()

    gates = runner._start_requirements(sweep, supervised, tracker, "0", paths, None, {}, {}, interruption)
    runner._wait_for_requirements(gates, interruption)
    assert set(gates) == {c.key for c in supervised}  # the cell that needs none has no gate: it starts at once
    failed = [c for c in supervised if c.spec.augmentation.selector.k == 2][0]
    kept = [c for c in supervised if c is not failed][0]
    assert gates[kept.key].exception() is None and prepared_cells == [kept.key]
    error = str(gates[failed.key].exception())
    assert "selector diverged" in error and "run the sweep again" in error
