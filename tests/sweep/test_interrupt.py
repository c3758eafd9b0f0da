"""Ctrl-C, resume, and sweeps that would step on each other, end to end on a tiny sweep."""

import json
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
import yaml

from tests.helpers import by_kind, mlflow_runs, orchestrate, run_cli, sweep_yaml

pytestmark = pytest.mark.slow  # real sweeps: Ray Tune, Ray Train, MLflow


def _wait_for(path: Path, text: str, process, seconds: float = 900) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if path.exists() and text in path.read_text():
            return
        assert process.poll() is None, path.read_text()[-3000:] if path.exists() else "ended"
        time.sleep(0.5)
    raise AssertionError(f"'{text}' never appeared in {path}")


def test_ctrl_c_mid_search_keeps_what_ended_and_a_rerun_finishes_with_the_right_winners(tmp_path, tiny_model_dir, scifact_dir):
    spec = sweep_yaml(tmp_path / "tiny.yaml", tiny_model_dir, "tiny-ctrl-c",
                      [{"ranking": "pointwise", "contrastive": "scl"}], epochs=2)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri]
    sweep = orchestrate(tmp_path, "sweep", str(spec), *common, background=True)
    # Two trials run at a time and start together: the first cell's first trial can end with the
    # other's, leaving nothing running. Interrupt once both ended and a second trial of a cell
    # has begun (its storage folder is there; it has an epoch left).
    _wait_for(tmp_path / "background.err", "trials 2/", sweep)
    trials_storage = tmp_path / "store" / "tiny-ctrl-c" / "ray"
    deadline = time.time() + 300
    while not list(trials_storage.glob("cell-*-t1")) and time.time() < deadline and sweep.poll() is None:
        time.sleep(0.2)
    assert list(trials_storage.glob("cell-*-t1")), (tmp_path / "background.err").read_text()[-3000:]
    interrupted_at = time.time()
    os.killpg(sweep.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole process group
    sweep.wait(timeout=120)
    stopped_in = time.time() - interrupted_at
    err = (tmp_path / "background.err").read_text()
    assert sweep.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: sweep tiny-ctrl-c interrupted: "), err[-2000:]
    assert "testing the winners" not in err and "Traceback" not in err.split("interrupted:")[-1]
    assert stopped_in < 60  # within seconds (generous for a loaded CI machine)

    _, runs = mlflow_runs(uri, "tiny-ctrl-c")
    statuses = {r.info.status for r in runs}
    assert "RUNNING" not in statuses  # nothing left open
    cells = by_kind(runs, "cell")
    assert not [c for c in cells if c.info.status == "FINISHED"]  # no cell had both trials: none is tested
    assert by_kind(runs, "sweep")[0].info.status == "KILLED"
    trials = by_kind(runs, "trial")
    assert sum(t.info.status == "FINISHED" for t in trials) >= 1
    stopped = [t for t in trials if t.info.status == "KILLED"]
    assert stopped and all(t.data.tags.get("rerank_lab.interrupted") == "true" for t in stopped)
    status = json.loads(run_cli(tmp_path, "status", str(spec), "--json", *common).stdout)
    assert all(status[k] >= 0 for k in status if k.startswith("cells_"))
    assert status["cells_done"] == 0 and status["trials_interrupted"] == len(stopped)
    assert sum(status[k] for k in ("cells_done", "cells_failed", "cells_stale", "cells_interrupted", "cells_running",
                                   "cells_pending")) == status["cells"]

    rerun = orchestrate(tmp_path, "sweep", str(spec), "--json", *common)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _, runs = mlflow_runs(uri, "tiny-ctrl-c")
    assert {r.info.status for r in runs} == {"FINISHED"}
    storage = f"sqlite:///{tmp_path / 'store' / 'tiny-ctrl-c' / 'optuna.db'}"
    for cell in by_kind(runs, "cell"):
        study = optuna.load_study(study_name=cell.data.tags["rerank_lab.cell"], storage=storage)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(complete) == 2  # exactly its trials, none repeated
        assert len({tuple(sorted(t.params.items())) for t in complete}) == 2  # never the same parameters twice
        best = max(complete, key=lambda t: t.value)
        winner = next(r for r in runs if r.info.run_id == cell.data.tags["rerank_lab.winner"])
        assert winner.data.tags["rerank_lab.optuna_trial"] == str(best.number)  # the winner over all its trials
        assert cell.data.metrics["best_val_ndcg_at_10"] == pytest.approx(best.value)
    keys = [r.data.tags["rerank_lab.trial_key"] for r in by_kind(runs, "trial")]
    assert len(keys) == len(set(keys)) == 2 * len(by_kind(runs, "cell"))  # no duplicate trial runs

    listed = json.loads(run_cli(tmp_path, "runs", str(spec), "--json", "--tracking-uri", uri).stdout)
    assert {r["run_id"] for r in listed["runs"]} == {r.info.run_id for r in runs}  # the ids compare takes
    reset = run_cli(tmp_path, "reset", str(spec), "--yes", *common)
    assert reset.returncode == 0, reset.stderr[-2000:]
    assert not (tmp_path / "store" / "tiny-ctrl-c" / "optuna.db").exists()
    gone = run_cli(tmp_path, "status", str(spec), *common)
    assert gone.returncode == 2 and "no trace of sweep 'tiny-ctrl-c'" in gone.stderr


def test_two_sweep_files_of_one_name_and_two_runs_of_one_sweep_refuse(tmp_path, tiny_model_dir, scifact_dir):
    # one cell, one trial: what is checked is the refusals, not the search
    spec = sweep_yaml(tmp_path / "tiny.yaml", tiny_model_dir, "tiny-one", [{"ranking": "pointwise"}], trials_per_cell=1,
                      augmentations=({"method": "none"},))
    config = yaml.safe_load(spec.read_text())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri]
    first = orchestrate(tmp_path, "sweep", str(spec), *common, background=True)
    _wait_for(tmp_path / "background.err", "trial(s) to run", first)
    second = run_cli(tmp_path, "sweep", str(spec), *common)  # the same sweep, while the first runs
    assert second.returncode == 2 and "the sweep is already running (pid" in second.stderr, second.stderr[-2000:]
    assert len(second.stderr.strip().splitlines()) == 1
    first.wait(timeout=900)
    assert first.returncode == 0, (tmp_path / "background.err").read_text()[-3000:]
    _, before = mlflow_runs(uri, "tiny-one")
    report_before = {r.info.run_id: r.data.tags.get("mlflow.note.content") for r in before}

    other = tmp_path / "elsewhere" / "other.yaml"
    other.parent.mkdir()
    config["grid"]["sizes"] = [40]  # another sweep file, the same name
    other.write_text(yaml.safe_dump(config))
    for command in ("sweep", "status", "report"):
        proc = run_cli(tmp_path, command, str(other), *common)
        assert proc.returncode == 2 and "sweep name 'tiny-one' is already used" in proc.stderr, (command, proc.stderr[-2000:])
        assert str(spec.resolve()) in proc.stderr
    # a report of the right file reads, and writes nothing to MLflow unless asked (--log)
    proc = run_cli(tmp_path, "report", str(spec), *common, "--no-plots", "--out", str(tmp_path / "elsewhere-reports"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, after = mlflow_runs(uri, "tiny-one")
    assert {r.info.run_id: r.data.tags.get("mlflow.note.content") for r in after} == report_before
    root = by_kind(after, "sweep")[0]
    assert "| BM25 (first stage) |" in report_before[root.info.run_id]  # the finished sweep logged its own report


def test_results_are_not_reused_when_their_data_changed(tmp_path, tiny_model_dir, scifact_dir):
    """Cutting the test qrels after a sweep: status and report say the cells are stale, and a rerun
    tests the winners again on today's data (the trials, trained on unchanged data, are kept)."""
    held_out = tmp_path / "heldout"
    (held_out / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl.gz", "queries.jsonl"):
        (held_out / name).symlink_to(scifact_dir / name)
    lines = (scifact_dir / "qrels" / "test.tsv").read_text().splitlines()
    (held_out / "qrels" / "test.tsv").write_text("\n".join(lines[:40]) + "\n")
    spec = sweep_yaml(tmp_path / "tiny.yaml", tiny_model_dir, "tiny-data", [{"ranking": "pointwise"}],  # one cell, one trial
                      test_collection=str(held_out), trials_per_cell=1, augmentations=({"method": "none"},))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri]
    assert run_cli(tmp_path, "sweep", str(spec), *common, timeout=1200).returncode == 0
    _, runs = mlflow_runs(uri, "tiny-data")
    tested_on = {c.data.tags["rerank_lab.cell"]: c.data.metrics["test_ndcg_at_10"] for c in by_kind(runs, "cell")}

    (held_out / "qrels" / "test.tsv").write_text("\n".join(lines[:5]) + "\n")  # 4 judgements left
    status = json.loads(run_cli(tmp_path, "status", str(spec), "--json", *common).stdout)
    assert status["cells_stale"] == len(tested_on) and status["cells_done"] == 0
    report = run_cli(tmp_path, "report", str(spec), *common, "--no-plots", "--format", "csv", "--out",
                         str(tmp_path / "reports"))
    assert report.returncode == 0 and "stale" in report.stdout and not any(
        f"{value!r}" in report.stdout for value in tested_on.values())

    rerun = run_cli(tmp_path, "sweep", str(spec), *common, timeout=1200)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _, runs = mlflow_runs(uri, "tiny-data")
    for cell in by_kind(runs, "cell"):
        per_query = json.loads(Path(cell.info.artifact_uri.removeprefix("file://"), "per_query", "test.json").read_text())
        assert per_query["num_queries"] == len({line.split()[0] for line in lines[1:5]})  # today's queries
    assert len(by_kind(runs, "trial")) == len(tested_on)  # no trial trained again


def test_a_worker_no_node_can_hold_is_one_line_not_a_wait(tmp_path, tiny_model_dir, scifact_dir):
    spec = sweep_yaml(tmp_path / "tiny.yaml", tiny_model_dir, "tiny-big", [{"ranking": "pointwise", "contrastive": "scl"}])
    config = yaml.safe_load(spec.read_text())
    config["base"]["resources"]["cpus_per_worker"] = 64
    config["search"]["trials_per_cell"] = 1
    spec.write_text(yaml.safe_dump(config))
    started = time.time()
    proc = run_cli(tmp_path, "sweep", str(spec), "--storage", str(tmp_path / "store"), "--tracking-uri",
                   f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert proc.returncode == 2 and time.time() - started < 300, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [errors[0]] and "resources.cpus_per_worker 64" in errors[0] and "a worker could never start" in errors[0]


def test_ctrl_c_during_run_says_what_is_kept_and_leaves_no_run_open(tmp_path, tiny_model_dir, scifact_dir):
    """Ray Train's fit() would take SIGINT for itself and end the process with status 1 and no
    word, its MLflow run left RUNNING; the command's own handling answers instead."""
    config = {
        "name": "tiny-run-ctrl-c",
        "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 20, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 1500, "seed": 3},
        "model": {"name": str(tiny_model_dir), "max_length": 128},
        "optimization": {"epochs": 20, "batch_size": 8},
        "resources": {"workers": 1, "cpus_per_worker": 1},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = orchestrate(tmp_path, "run", str(path), "--tracking-uri", uri, "--storage", str(tmp_path / "ray"), background=True)
    _wait_for(tmp_path / "background.err", "[train] ", run)  # training has started
    time.sleep(2)
    interrupted_at = time.time()
    os.killpg(run.pid, signal.SIGINT)  # a terminal's Ctrl-C
    run.wait(timeout=120)
    err = (tmp_path / "background.err").read_text()
    assert run.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted: trial tiny-run-ctrl-c stopped before it finished"), err[-2000:]
    assert "Traceback" not in err and time.time() - interrupted_at < 60
    _, runs = mlflow_runs(uri, "tiny-run-ctrl-c")
    assert [(r.info.status, r.data.tags.get("rerank_lab.interrupted")) for r in runs] == [("KILLED", "true")]
