"""A sweep's store on disk, through the command line: ``reset`` removes only a store orchestrate
wrote (never a user's folder that carries the sweep's name), and a finished store moved or copied
with its project folder reads as it did in place.

The stores are written by the code a sweep uses (claim_store, bind_store, the tracker's runs), with
constructed evaluations instead of training: seconds, no Ray.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import expand_grid, load_sweep
from orchestrator.sweep.runner import _cell_runs
from orchestrator.sweep.store import MARKER, bind_store, sweep_lock, sweep_paths
from tests.helpers import by_kind, mlflow_runs, run_cli
from workloads.evaluation import Evaluation

SWEEP = {
    "name": "demo",
    "base": {"data": {"collection": "beir/scifact"}},
    "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
             "augmentations": [{"method": "bm25", "k": 2}], "sizes": [100]},
    "search": {"trials_per_cell": 1},
}
QUERIES = [f"q{i:02d}" for i in range(20)]


def one_line(proc, *expected: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and all(text in lines[0] for text in expected), lines[0]
    return lines[0]


def files_under(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def sweep_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "demo.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    return path


def write_store(project: Path, finished: bool = True) -> Path:
    """A project folder as `orchestrate sweep demo.yaml` leaves it (defaults: ./.orchestrate/mlflow.db,
    its mlartifacts, ./.orchestrate/sweeps/demo), each cell tested on constructed per-query values."""
    sweep = load_sweep(sweep_file(project))
    paths = sweep_paths(sweep, project / ".orchestrate" / "sweeps")
    tracker = Tracker(f"sqlite:///{project / '.orchestrate' / 'mlflow.db'}")
    with sweep_lock(paths):  # creates the store, as the sweep does
        (paths.root / "optuna.db").write_bytes(b"")  # what the search would have written beside the record
        experiment_id = tracker.experiment_id(sweep.name)
        bind_store(sweep, paths, tracker, tracker.client.get_experiment(experiment_id))
    rng = np.random.default_rng(7)
    cells = expand_grid(sweep)
    first_stage = rng.uniform(0.1, 0.5, len(QUERIES))
    for shift, run_id in enumerate(_cell_runs(tracker, experiment_id, sweep, cells).values()):
        for prefix, values in (("test_", rng.uniform(0.2, 0.6, len(QUERIES)) + 0.05 * shift), ("bm25_test_", first_stage)):
            ndcg = dict(zip(QUERIES, map(float, values)))
            ap = {q: v / 2 for q, v in ndcg.items()}
            tracker.log_evaluation(run_id, prefix, Evaluation({"ndcg_at_10": float(np.mean(values)), "ap": float(np.mean(values) / 2)},
                                                              {"ndcg_at_10": ndcg, "ap": ap}, 1, len(QUERIES)))
        tracker.log_metrics(run_id, {"best_val_ndcg_at_10": 0.4 + 0.01 * shift, "trials_complete": 1})
        if finished:
            tracker.finish(run_id)
    return paths.root


# ----------------------------------------------------------------------------- reset


def test_reset_refuses_a_users_folder_of_the_sweeps_name_and_removes_nothing(tmp_path):
    config = sweep_file(tmp_path)
    thesis = tmp_path / "st" / "demo" / "thesis"
    thesis.mkdir(parents=True)
    (thesis / "main.tex").write_text("\\documentclass{article}")
    (tmp_path / "demo").mkdir()  # `--storage .` would name this folder
    (tmp_path / "demo" / "notes.txt").write_text("mine")
    before = files_under(tmp_path)
    for storage, folder, entry in (("st", tmp_path / "st" / "demo", "thesis"), (".", tmp_path / "demo", "notes.txt")):
        proc = run_cli(tmp_path, "reset", str(config), "--yes", "--storage", storage)
        one_line(proc, str(folder), "not a store of sweep 'demo'", entry, "nothing removed")
    # nor does a sweep write into it (before anything is written, the MLflow store included)
    one_line(run_cli(tmp_path, "sweep", str(config), "--storage", "st"), str(tmp_path / "st" / "demo"), "not a store")
    assert files_under(tmp_path) == before and not (tmp_path / ".orchestrate").exists()


def test_reset_removes_a_store_it_wrote_and_one_written_before_the_marker(tmp_path):
    root = write_store(tmp_path)
    (root / "ray" / "demo").mkdir(parents=True)
    (root / "ray" / "demo" / "checkpoint.pt").write_bytes(b"x")
    (root / "notes.md").write_text("mine")  # put into the marked store by its user: never ours to remove
    proc = run_cli(tmp_path, "reset", "demo.yaml", "--yes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"removed {root}" in proc.stdout and "MLflow experiment 'demo'" in proc.stdout and "left" in proc.stdout
    assert (root / "notes.md").read_text() == "mine"
    (root / "notes.md").unlink()
    assert sorted(p.name for p in root.iterdir()) == [MARKER, "sweep.lock"]  # still the store, and empty
    # a store written before the marker existed: only what a sweep writes (its record, Optuna's, the lock)
    (root / MARKER).unlink()
    (root / "sweep.json").write_text(json.dumps({"name": "demo", "file": str(tmp_path / "demo.yaml")}))
    (root / "optuna.db").write_bytes(b"")
    proc = run_cli(tmp_path, "reset", "demo.yaml", "--yes")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (root / "optuna.db").exists() and not (root / "sweep.json").exists()
    # the same with a file of the user's beside them is not such a store: refused, all kept
    (root / "sweep.json").write_text(json.dumps({"name": "demo", "file": str(tmp_path / "demo.yaml")}))
    (root / MARKER).unlink()
    (root / "draft.md").write_text("mine")
    one_line(run_cli(tmp_path, "reset", "demo.yaml", "--yes"), "draft.md", "nothing removed")
    assert (root / "draft.md").read_text() == "mine" and (root / "sweep.json").exists()


# ----------------------------------------------------------------------------- moved and copied stores


def _report(project: Path, out: Path):
    proc = run_cli(project, "report", "demo.yaml", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.replace(str(out), "OUT"), sorted(p.name for p in (out / "demo").glob("*.png"))


@pytest.fixture(scope="module")
def in_place(tmp_path_factory):
    """A finished project folder and its report (table and figures) where it was written."""
    project = tmp_path_factory.mktemp("store") / "exp"
    write_store(project)
    table, figures = _report(project, project.parent / "out")
    assert "| missing" not in table and "0.4" in table and len(figures) == 2, table
    return project, table, figures


def test_a_moved_store_reports_what_it_did_in_place(in_place, tmp_path):
    """rsync or rename the project folder: MLflow's absolute artifact paths point where it was."""
    _, table, figures = in_place
    write_store(tmp_path / "exp")  # the same values as in place
    shutil.move(tmp_path / "exp", tmp_path / "moved")
    assert _report(tmp_path / "moved", tmp_path / "out") == (table, figures)
    status = run_cli(tmp_path / "moved", "status", "demo.yaml")
    assert status.returncode == 0 and "cells done 2," in status.stdout, status.stderr[-3000:]
    # writing to the moved store (the report logged to its sweep run) writes where it is now
    logged = run_cli(tmp_path / "moved", "report", "demo.yaml", "--no-plots", "--log", "--out", str(tmp_path / "o"))
    assert logged.returncode == 0, logged.stderr[-3000:]
    assert not (tmp_path / "exp").exists()
    assert list((tmp_path / "moved" / ".orchestrate" / "mlartifacts").rglob("report/table-ndcg_at_10-scifact.md"))


def test_a_copied_project_reads_its_own_store(in_place, tmp_path):
    """`cp -r exp copy`: the original sweep file still exists beside the original store; the
    copy is read, as its own, from its own files."""
    project, table, figures = in_place
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)
    hidden = project.parent / "hidden-mlartifacts"
    (project / ".orchestrate" / "mlartifacts").rename(hidden)  # the original's files are not what the copy reads
    try:
        assert _report(copy, tmp_path / "out") == (table, figures)
        _, runs = mlflow_runs(f"sqlite:///{copy / '.orchestrate' / 'mlflow.db'}", "demo")
        cells = sorted(r.info.run_id for r in by_kind(runs, "cell"))
        compared = run_cli(copy, "compare", *cells, "--json")
        assert compared.returncode == 0 and json.loads(compared.stdout)["queries"] == len(QUERIES), compared.stderr[-3000:]
        # the copy written to (the report logged to its sweep run): into the copy, never the original
        logged = run_cli(copy, "report", "demo.yaml", "--no-plots", "--log", "--out", str(tmp_path / "o"))
        assert logged.returncode == 0, logged.stderr[-3000:]
        assert not (project / ".orchestrate" / "mlartifacts").exists()
        assert list((copy / ".orchestrate" / "mlartifacts").rglob("report/table-ndcg_at_10-scifact.md"))
        # a record written before stores recorded where they were: the original file, the same bytes, is this sweep
        record = copy / ".orchestrate" / "sweeps" / "demo" / "sweep.json"
        record.write_text(json.dumps({key: value for key, value in json.loads(record.read_text()).items() if key != "store"}))
        status = run_cli(copy, "status", "demo.yaml")
        assert status.returncode == 0 and "cells done 2," in status.stdout, status.stderr[-3000:]
        (copy / "demo.yaml").write_text((copy / "demo.yaml").read_text() + "# edited\n")  # another file now
        assert "sweep name 'demo' is already used" in run_cli(copy, "status", "demo.yaml").stderr
    finally:
        hidden.rename(project / ".orchestrate" / "mlartifacts")


def test_a_database_moved_without_its_artifacts_is_one_line(tmp_path):
    write_store(tmp_path / "exp")
    (tmp_path / "moved").mkdir()
    shutil.move(tmp_path / "exp" / ".orchestrate", tmp_path / "moved" / ".orchestrate")
    shutil.move(tmp_path / "exp" / "demo.yaml", tmp_path / "moved" / "demo.yaml")
    shutil.move(tmp_path / "moved" / ".orchestrate" / "mlartifacts", tmp_path / "elsewhere")
    shutil.rmtree(tmp_path / "exp")
    one_line(run_cli(tmp_path / "moved", "report", "demo.yaml", "--no-plots", "--quiet", "--out", str(tmp_path / "o")),
             "this MLflow store was moved from", str(tmp_path / "exp"), "copy the mlartifacts folder")
