"""The grid is expanded once per command: the loaded sweep carries its cells (``SweepSpec.cells``)
and every step of ``orchestrate sweep`` reads them there instead of expanding the grid again."""

from pathlib import Path

import pytest

from orchestrator.sweep import runner
from tests.helpers import run_cli
from workloads.kinds import TRIAL_KINDS

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "search_spaces" / "demo.yaml"


@pytest.fixture
def expansions():
    """How many times any kind's grid was expanded (each kind's ``grid.expand`` wrapped)."""
    calls = []
    grids = [kind.grid for kind in TRIAL_KINDS.values() if kind.grid is not None]
    originals = [grid.expand for grid in grids]

    def counting(expand):
        def wrapped(sweep):
            calls.append(sweep.name)
            return expand(sweep)
        return wrapped

    for grid, expand in zip(grids, originals):
        object.__setattr__(grid, "expand", counting(expand))  # (a frozen dataclass)
    try:
        yield calls
    finally:
        for grid, expand in zip(grids, originals):
            object.__setattr__(grid, "expand", expand)


def test_a_dry_run_expands_the_grid_once(tmp_path, expansions):
    proc = run_cli(tmp_path, "sweep", DEMO, "--dry-run", "--storage", tmp_path / "store")
    assert proc.returncode == 0, proc.stderr
    assert "6 cells" in proc.stdout
    assert expansions == ["demo"]


def test_a_run_expands_the_grid_once_up_to_tune_and_after(tmp_path, expansions, monkeypatch):
    """A real run's driver, without Ray: every step up to the Tune run (the cluster's room and the
    data are stubbed), then what the driver reads after it (the cells' statistics, the end
    state's report, the command's MLflow report)."""
    reached = []

    def search_and_test(sweep, tracker, experiment_id, cells, paths, *args, **kwargs):
        reached.append(len(cells))
        runner.log_cell_statistics(sweep, tracker, experiment_id)
        return runner.dry_run_report(sweep, paths)

    monkeypatch.setattr(runner, "check_cluster", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_prepare_cells", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_search_and_test", search_and_test)
    proc = run_cli(tmp_path, "sweep", DEMO, "--storage", tmp_path / "store", "--tracking-uri",
                   f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert proc.returncode == 0, proc.stderr
    assert reached == [6]
    assert expansions == ["demo"]
