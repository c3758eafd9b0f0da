"""run_sweep's sequence around the sweep itself: the store's lock, and the command's hook once the
sweep has finished (how ``orchestrate sweep`` logs its report without the sweep importing it)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cli.sweep import log_default_report
from orchestrator.sweep import runner
from orchestrator.sweep.store import sweep_lock, sweep_paths
from tests.helpers import run_cli
from workloads.core.errors import InputError


def test_the_finished_hook_runs_under_the_lock_once_the_sweep_has_ended(tmp_path, monkeypatch):
    sweep = SimpleNamespace(name="hooked")
    paths = sweep_paths(sweep, tmp_path)
    calls = []

    def finished(seen_sweep, tracker):
        with pytest.raises(InputError, match="already running"):  # still this sweep's: nobody else may start it
            with sweep_lock(paths):
                pass
        calls.append(("finished", seen_sweep, tracker))

    monkeypatch.setattr(runner, "_run_sweep", lambda *args: calls.append("sweep") or {"end": "state"})
    assert runner.run_sweep(sweep, "tracker", tmp_path, on_finished=finished) == {"end": "state"}
    assert calls == ["sweep", ("finished", sweep, "tracker")]

    def fails(*args):
        raise RuntimeError("a cell's evaluation failed")

    calls.clear()
    monkeypatch.setattr(runner, "_run_sweep", fails)
    with pytest.raises(RuntimeError, match="evaluation failed"):
        runner.run_sweep(sweep, "tracker", tmp_path, on_finished=finished)
    assert calls == []  # no report of a sweep that did not finish


def test_the_command_hands_its_report_to_the_sweep_as_the_finished_hook(tmp_path, monkeypatch):
    seen = {}

    def run_sweep(sweep, tracker, storage_root, **options):
        seen.update(options)
        return {"sweep": sweep.name}

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    demo = Path(__file__).resolve().parents[2] / "search_spaces" / "demo.yaml"
    proc = run_cli(tmp_path, "sweep", str(demo), "--json", "--storage", str(tmp_path / "store"),
                   "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seen["on_finished"] is log_default_report
