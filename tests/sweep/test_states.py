"""Each cell's state, read from its MLflow cell run: one reading for ``orchestrate status`` and the
report (the report imports it from the sweep, never the reverse)."""

import yaml

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle import identity
from orchestrator.lifecycle.targets import targets
from orchestrator.report.build import load_results
from orchestrator.report.results import load_sweep_results
from orchestrator.sweep.grid import SweepSpec, expand_grid, load_sweep
from orchestrator.sweep.runner import _cell_runs
from orchestrator.sweep.status import STATUS_OK, _cell_states, cell_states
from tests.helpers import run_cli

SWEEP = {"name": "states", "base": {"data": {"collection": "beir/scifact"}},
         "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"},
                                                 {"ranking": "pointwise", "contrastive": "ctriplet"}],
                  "augmentations": [{"method": "bm25", "k": 2}], "sizes": [100, 200]},
         "search": {"trials_per_cell": 1}}


def test_every_cell_has_one_state_from_its_run(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    sweep = SweepSpec.model_validate(SWEEP)
    cells = expand_grid(sweep)
    assert len(cells) == 6 and all(c.spec is not None for c in cells)
    experiment_id = tracker.experiment_id(sweep.name)
    runs = _cell_runs(tracker, experiment_id, sweep, cells[:5])  # the last cell has no run yet
    tested_on = identity.test_data_identity(targets(cells[0].spec, []))
    ok, stale, interrupted, failed, running = (runs[c.key] for c in cells[:5])
    tracker.set_tags(ok, {schema.TEST_DATA_TAG: tested_on})
    tracker.finish(ok, "FINISHED")
    tracker.set_tags(stale, {schema.TEST_DATA_TAG: "data-that-changed-since"})
    tracker.finish(stale, "FINISHED")
    tracker.set_tags(interrupted, {schema.INTERRUPTED_TAG: "true"})
    tracker.finish(interrupted, "KILLED")
    tracker.finish(failed, "FAILED")
    expected = dict(zip([c.key for c in cells], [STATUS_OK, "stale", "interrupted", "failed", "running", "pending"]))

    found_id, states = cell_states(sweep, tracker)
    assert found_id == experiment_id
    assert {cell.key: state for cell, state, _ in states} == expected
    assert [run.info.run_id if run else None for _, _, run in states] == [runs[c.key] for c in cells[:5]] + [None]
    # the report reads the same states
    assert {r.cell.key: r.status for r in load_sweep_results(sweep, tracker).cells} == expected
    # status names a tested cell "done"; a cell with a trial under way (or ended) but not tested, "running"
    plan = {"cells_detail": [{"key": c.key, "unavailable": None, "trials_done": int(c is cells[4])} for c in cells]}
    assert _cell_states(sweep, tracker, plan, []) == {**expected, cells[0].key: "done"}
    found_id, states = cell_states(SweepSpec.model_validate({**SWEEP, "name": "never-ran"}), tracker)
    assert found_id is None and [(state, run) for _, state, run in states] == [("pending", None)] * 6


def test_test_data_not_found_here_is_said_so_never_called_stale(tmp_path, monkeypatch, project_log):
    """A finished store seen from a shell without ORCHESTRATE_DATA_DIR: beir/scifact resolves to no
    directory, so its identity is not the recorded one. The data did not change: each cell is done,
    and status and the report say the data cannot be checked here (not "stale, testing again")."""
    config = tmp_path / "states.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    sweep = load_sweep(config)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    cells = expand_grid(sweep)
    runs = _cell_runs(tracker, tracker.experiment_id(sweep.name), sweep, cells)
    tested_on = identity.test_data_identity(targets(cells[0].spec, []))  # with the data directory set
    for run in runs.values():
        tracker.set_tags(run, {schema.TEST_DATA_TAG: tested_on})
        tracker.finish(run, "FINISHED")

    monkeypatch.delenv("ORCHESTRATE_DATA_DIR")
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path / "no-ir-datasets"))  # nor an ir_datasets copy
    assert identity.test_data_identity(targets(cells[0].spec, [])) != tested_on  # what made every cell "stale"
    assert {state for _, state, _ in cell_states(sweep, tracker)[1]} == {STATUS_OK}
    assert {r.status for r in load_results(sweep, tracker).cells} == {STATUS_OK}  # the report shows their numbers
    line = ("cannot check: beir/scifact not found (set ORCHESTRATE_DATA_DIR to the data directory the sweep ran with): "
            "whether its cells were tested on today's data is unknown")
    assert f"states: {line}" in [r.getMessage() for r in project_log.records]
    status = run_cli(tmp_path, "status", str(config), "--tracking-uri", uri, "--storage", str(tmp_path / "store"))
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[:2] == [
        "sweep states: cells done 6, running 0, failed 0, pending 0 (of 6); trials finished 0, pruned 0, failed 0, "
        "interrupted 0, running 0", line]
    assert "stale" not in status.stdout + status.stderr
