"""`orchestrate sweep` end to end with a tiny random BERT on real SciFact data: exact MLflow
run counts, retries then failure of a raising trial, status, idempotent reruns and the
doc19 dry run (resume after SIGKILL and other faults: tests/sweep/test_chaos.py)."""

import ast
import csv
import io
import json
import os
import pickle
import re
import subprocess
import sys
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.cli.ui import experiment_links
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import expand_grid, load_sweep
from tests.helpers import (
    FAIL_CELLS_ENV,
    HELD_OUT_QUERIES,
    by_kind,
    chromium_driver,
    free_port,
    mlflow_runs,
    run_cli,
    serve_ui,
)
from workloads.core.errors import InputError
from workloads.data.resolve import resolve_collection
from workloads.evaluation import SELECTION_PER_QUERY, evaluate
from workloads.retrieval.bm25 import retrieve

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_counts_before_running(failing_sweep):
    *_, plan, _ = failing_sweep
    assert (plan["cells"], plan["baseline_cells"], plan["trials_planned"], plan["mlflow_runs_planned"]) == (3, 1, 6, 10)
    assert plan["trials_done"] == 0
    searched = {c["loss"]: set(c["searched"]) for c in plan["cells_detail"]}
    assert searched["pointwise"] == {"learning_rate"}  # conditional spaces: tau only where the loss has it
    assert searched["pointwise+scl"] == {"learning_rate", "lambda_", "tau", "k"}
    assert searched["pointwise+ctriplet"] == {"learning_rate", "lambda_", "contrastive_margin", "k"}


def test_exact_runs_tags_and_metrics(failing_sweep):
    work, spec, uri, common, failing, plan, report = failing_sweep
    client, runs = mlflow_runs(uri, "tiny-fail")
    cells, trials = by_kind(runs, "cell"), by_kind(runs, "trial")
    assert len(cells) == 3 and len(trials) == 6 and len(by_kind(runs, "sweep")) == 1
    assert len({r.data.tags["rerank_lab.trial_key"] for r in runs}) == 10  # no duplicates
    root = by_kind(runs, "sweep")[0].info.run_id
    assert all(cell.data.tags["mlflow.parentRunId"] == root for cell in cells)
    parents = {r.info.run_id: r for r in cells}
    axes = ("model", "loss", "augmentation", "size", "seed", "collection")
    for trial in trials:
        cell = parents[trial.data.tags["mlflow.parentRunId"]]
        # one vocabulary: a trial run carries exactly its cell run's axis tags (searched k_a is a param)
        assert {a: trial.data.tags[a] for a in axes} == {a: cell.data.tags[a] for a in axes}
        assert trial.data.tags["rerank_lab.cell"] == cell.data.tags["rerank_lab.cell"]
    finished = [t for t in trials if t.info.status == "FINISHED"]
    assert len(finished) == 4
    for trial in finished:
        assert "best_val_ndcg_at_10" in trial.data.metrics and trial.data.metrics["time_overhead_seconds"] > 0
        assert trial.data.metrics["time_trial_seconds"] >= trial.data.metrics["time_train_wall_seconds"] > 0
        assert len(client.get_metric_history(trial.info.run_id, "val_ndcg_at_10")) == 1  # one epoch, logged once
    winners = [c for c in cells if c.info.status == "FINISHED"]
    assert len(winners) == 2
    # the winners are tested on data.test_collection (the held-out copy), not on the training collection

    held_out = resolve_collection(str(work / "scifact-heldout"))
    bm25_run, _ = retrieve(held_out, held_out.split_queries("test"), k=1000)
    bm25_held_out = evaluate(bm25_run, held_out.split_qrels("test"), held_out.relevance_level).aggregate["ndcg_at_10"]
    assert bm25_held_out != pytest.approx(0.6789, abs=0.002)
    for cell in winners:
        assert 0 <= cell.data.metrics["test_ndcg_at_10"] <= 1 and "rerank_lab.winner" in cell.data.tags
        assert cell.data.metrics["bm25_test_ndcg_at_10"] == pytest.approx(bm25_held_out, abs=1e-9)
        per_query = json.loads(Path(client.download_artifacts(cell.info.run_id, "per_query/test.json")).read_text())
        assert per_query["num_queries"] == HELD_OUT_QUERIES
        # logged by the lifecycle like `orchestrate run`: BM25 and the cross-encoder alone per query, both TREC runs
        artifacts = {a.path for a in client.list_artifacts(cell.info.run_id, "per_query")}
        assert {"per_query/bm25_test.json", "per_query/test_cross_encoder.json"} <= artifacts
        assert {a.path for a in client.list_artifacts(cell.info.run_id, "runs")} == {"runs/test.reranked.trec", "runs/test.bm25.trec"}
        assert "bm25_val_ndcg_at_10" in cell.data.metrics
        # interpolation: the winner is tested with the weight tuned on validation at its best epoch
        winner = client.get_run(cell.data.tags["rerank_lab.winner"])
        assert cell.data.metrics["test_interpolation_weight"] == winner.data.metrics["best_val_interpolation_weight"]
        history = client.get_metric_history(winner.info.run_id, "val_interpolation_weight")
        assert [m.value for m in history] == [winner.data.metrics["best_val_interpolation_weight"]]  # one epoch


def test_trials_reuse_the_data_the_driver_prepared(failing_sweep):
    work, *_ = failing_sweep
    log = (work / "first.err").read_text().splitlines()
    driver = [line for line in log if line.startswith("[augment]")]  # the session's cache may hold them already
    for k in (1, 2):  # every searched k_a is built (or found) by the driver
        assert any(f"bm25 k_a={k}" in line or f"-bm25-k{k}-" in line for line in driver), driver
    # the trials' own output (and Ray's) went to the sweep's log file, not to the terminal
    assert not any("_sweep_trial" in line for line in log)
    trial_lines = [line for line in (work / "store" / "tiny-fail" / "sweep.log").read_text().splitlines()
                   if "_sweep_trial" in line]
    assert any("[augment] reusing" in line for line in trial_lines)
    assert not any("[augment] bm25 k_a=" in line or "[bm25] indexed" in line for line in trial_lines)


def test_the_terminal_follows_the_search_then_the_winners_tests_to_the_end(failing_sweep):
    """Not a terminal (the fixture's pipe): a progress line per ended trial up to every trial,
    then a line per tested winner counting the winners, with the time testing has taken and
    the ETA (0 once the last is tested)."""
    work, *_ = failing_sweep
    log = (work / "first.err").read_text().splitlines()
    progress = [line for line in log if line.startswith("[sweep] tiny-fail: cells ")]
    assert len(progress) == 6 and progress[-1].startswith("[sweep] tiny-fail: cells 3/3 done | trials 6/6 done, 0 running, "
                                                          "2 failed | elapsed "), progress
    tested = [re.search(r"test nDCG@10 [0-9.]+ \[(\d+)/(\d+) tested \| testing (\S+), ETA (\S+)\]$", line)
              for line in log if " tested | " in line]
    assert [(m[1], m[2]) for m in tested] == [("1", "2"), ("2", "2")], log  # the failing cell has no winner to test
    seconds = [int(m[3].split("m")[0]) * 60 + int(m[3].split("m")[1][:-1]) for m in tested]
    eta = [int(m[4].split("m")[0]) * 60 + int(m[4].split("m")[1][:-1]) for m in tested]
    # the other cell's tests run after the first's (one slot: at most as long again) or beside them (two)
    assert eta[0] <= seconds[0] and eta[-1] == 0, tested


# Ray forwards worker output to the driver asynchronously: a line can arrive after the call
# that caused it (CI once saw a reused Tune process's exit traceback reach the terminal after
# tuner.fit had returned). The sweep's Ray session must end while its output still goes to
# the log file, so that nothing arrives later.
LATE_LINES_PROBE = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
import ray
from orchestrator.core.execution import init_ray
from orchestrator.sweep import runner

def sweep_body(sweep, tracker, paths, ray_address, verbose, interruption, max_concurrent=None):
    init_ray(None, num_cpus=1)

    @ray.remote(num_cpus=0)
    def say(text):
        print(text)

    ray.get(say.remote("first worker line"))
    log_file = paths.log_file
    deadline = time.time() + 60
    while "first worker line" not in log_file.read_text() and time.time() < deadline:
        time.sleep(0.1)
    ray.get(say.remote("late worker line"))  # done; its line is still on its way
    return {}

runner._run_sweep = sweep_body
runner.run_sweep(SimpleNamespace(name="probe"), None, Path(sys.argv[1]))
time.sleep(3)  # a line still on its way would reach the terminal now
print("ray initialized after the sweep:", ray.is_initialized())
"""


def test_ray_output_that_arrives_late_never_reaches_the_terminal(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", LATE_LINES_PROBE, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    terminal = proc.stdout + proc.stderr
    assert "worker line" not in terminal, terminal[-3000:]
    assert "first worker line" in (tmp_path / "probe" / "sweep.log").read_text()
    assert "ray initialized after the sweep: False" in proc.stdout


def test_trials_reuse_tune_processes(failing_sweep):
    """The sweep's Tune run was built to reuse finished trials' processes (what Tune saved of
    it). Which trial lands in which process is Tune's timing: a failing trial may take a
    cached process and end it, so counting the finished trials' pids is not a stable check
    (it saw 4 pids for 4 finished trials once in CI); benchmarks/tune_processes.py measures
    the reuse (6 trials in 2 processes)."""
    work, *_ = failing_sweep
    runs = list((work / "store" / "tiny-fail" / "ray").glob("tune-*/tuner.pkl"))
    assert runs
    for run in runs:
        tune_config = pickle.loads(run.read_bytes())["_tune_config"]
        assert tune_config.reuse_actors is True and tune_config.max_concurrent_trials == 2
    results = [json.loads(line) for run in runs for path in run.parent.glob("*/result.json") for line in path.read_text().splitlines()]
    finals = [r for r in results if r.get("final")]
    assert len(finals) == 4  # the four trials that do not raise finished in those processes
    # each epoch's per-query validation reaches Tune, and so the searcher (the Wilcoxon pruner's input)
    epochs = [r for r in results if "epoch" in r and not r.get("final")]
    assert len(epochs) == 4 and all(len(r[SELECTION_PER_QUERY]) == 5 for r in epochs)


def test_raising_trial_is_retried_then_failed_while_the_rest_completes(failing_sweep):
    work, spec, uri, common, failing, plan, report = failing_sweep
    attempts = Counter((work / "store" / "tiny-fail" / "ray" / "failed_attempts.log").read_text().split())
    assert len(attempts) == 2 and set(attempts.values()) == {2}  # max_failures 1: one retry each
    _, runs = mlflow_runs(uri, "tiny-fail")
    failed = [r for r in by_kind(runs, "trial") if r.info.status == "FAILED"]
    assert {r.data.tags["rerank_lab.cell"] for r in failed} == {failing}
    assert all(r.data.tags["failure"] == "error" for r in failed)
    failed_cell = [r for r in by_kind(runs, "cell") if r.info.status == "FAILED"]
    assert [r.data.tags["rerank_lab.cell"] for r in failed_cell] == [failing]
    status = run_cli(work, "status", str(spec), "--json", *common)
    data = json.loads(status.stdout)
    assert (data["cells_done"], data["cells_failed"], data["trials_finished"], data["trials_failed"]) == (2, 1, 4, 2)
    assert len(data["failed_trials"]) == 2 and data["best"] is not None


def test_rerun_of_a_finished_sweep_creates_nothing(failing_sweep):
    work, spec, uri, common, failing, plan, report = failing_sweep
    again = run_cli(work, "sweep", str(spec), "--json", *common, env={FAIL_CELLS_ENV: failing})
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["trials_to_run"] == 0
    _, runs = mlflow_runs(uri, "tiny-fail")
    assert len(runs) == 10


def test_doc19_dry_run_counts():
    proc = run_cli(REPO, "sweep", str(REPO / "search_spaces" / "doc19.yaml"), "--dry-run", "--json", "--storage", "/tmp/rerank-lab-dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    # 3 models x 5 sizes x (1 baseline + 4 losses x 4 augmentations) x 3 seeds = 765 cells, x 4 trials = 3,060 trial runs
    assert (plan["cells"], plan["baseline_cells"], plan["trials_planned"]) == (765, 45, 3060)
    assert plan["unavailable_cells"] == 0 and plan["runnable_cells"] == 765
    # one selector per (method, model, size, seed): selector.data is cell, so each size and seed trains its own
    selectors = plan["selectors"]
    assert len(selectors) == 2 * 3 * 5 * 3 and len({s["key"] for s in selectors}) == 90
    assert {(s["method"], s["cells"], s["data"], s["k"]) for s in selectors} == {("linear", 4, "cell", 20), ("attention", 4, "cell", 20)}
    assert plan["mlflow_runs_planned"] == 1 + 765 + 3060 + 90
    human = run_cli(REPO, "sweep", str(REPO / "search_spaces" / "doc19.yaml"), "--dry-run", "--storage", "/tmp/rerank-lab-dry-run")
    assert "765 cells" in human.stdout and "3060 trial runs" in human.stdout
    assert "selectors: 90" in human.stdout and "selector-attention-" in human.stdout
    # the compute estimate: use_gpu: true -> the A10G profile, every target's size known (TREC-DL 2019 + six zero-shot)
    estimate = plan["estimate"]
    assert estimate["profile"]["name"] == "a10g" and estimate["trials"] == 3060 and not estimate["cells_with_unknown_sizes"]
    assert estimate["device_hours"] == pytest.approx(estimate["train_hours"] + estimate["evaluation_hours"])
    largest = max(estimate["cells"], key=lambda c: c["hours"])
    assert largest["axes"]["size"] == "100000" and largest["train_pairs"] == 100000 * 2 * 2  # augmented, 2 epochs
    assert "device-hours on a10g" in human.stdout and "assumption: A10G" in human.stdout
    # each profile says whether it is measured or assumed, and the estimate's low-high range
    low, high = estimate["device_hours_range"]
    assert estimate["profile"]["status"] == "assumed" and low < estimate["device_hours"] < high
    assert "device-hours on a10g, assumed, range " in human.stdout
    assert "a10g (assumed)" in human.stdout and "h100 (measured)" in human.stdout


def test_demo_sweep_loads():
    cells = expand_grid(load_sweep(REPO / "search_spaces" / "demo.yaml"))
    assert len(cells) == 6 and all(c.spec is not None for c in cells)


def test_report_of_the_finished_sweep(failing_sweep):
    """The report on a real sweep: per-query artifacts as the sweep wrote them, the failed cell shown as failed."""
    work, spec, uri, common, failing, plan, report = failing_sweep
    proc = run_cli(work, "report", str(spec), "--tracking-uri", uri, "--out", str(work / "reports"), "--format", "csv")
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = {r["column"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}
    _, runs = mlflow_runs(uri, "tiny-fail")
    finished = {(r.data.tags["loss"], r.data.tags["augmentation"]): r for r in by_kind(runs, "cell") if r.info.status == "FINISHED"}
    baseline = finished[("pointwise", "none")].data.metrics["test_ndcg_at_10"]
    assert float(rows["baseline"]["value"]) == pytest.approx(baseline, abs=1e-12)
    scl = finished[("pointwise+scl", "bm25")].data.metrics["test_ndcg_at_10"]
    assert float(rows["bm25 / pointwise+scl"]["value"]) == pytest.approx(scl, abs=1e-12)
    # the sweep logged the cell's seeds and its interval against the baseline (orchestrator.sweep.winners.log_cell_statistics)
    logged = finished[("pointwise+scl", "bm25")].data.metrics
    assert logged["test_ndcg_at_10_seeds"] == 1 and logged["test_ndcg_at_10_seed_mean"] == pytest.approx(scl)
    assert logged["test_ndcg_at_10_difference"] == pytest.approx(scl - baseline, abs=1e-12)
    assert logged["test_ndcg_at_10_ci_low"] <= scl - baseline + 1e-12 <= logged["test_ndcg_at_10_ci_high"] + 2e-12
    # and, once finished, its default report on the sweep run (the command's on_finished: the sweep imports no report)
    assert "| BM25 (first stage) |" in by_kind(runs, "sweep")[0].data.tags["mlflow.note.content"]
    assert rows["bm25 / pointwise+ctriplet"]["status"] == "failed" and rows["bm25 / pointwise+ctriplet"]["value"] == ""
    assert len(list((work / "reports" / "tiny-fail").glob("*.png"))) == 2
    markdown = run_cli(work, "report", str(spec), "--tracking-uri", uri, "--out", str(work / "reports"), "--no-plots")
    assert "nDCG@10 on scifact-heldout" in markdown.stdout  # labelled with the collection it was measured on


def test_cells_and_trials_share_short_params_the_ui_can_compare(failing_sweep):
    """MLflow's compare views plot params against metrics: the grid axes and the searched
    hyper-parameters under the same short names on cell runs (the winner's values) and trial
    runs; the experiment says what the sweep is and how to compare it."""
    work, spec, uri, common, failing, plan, report = failing_sweep
    client, runs = mlflow_runs(uri, "tiny-fail")
    trials = {r.info.run_id: r for r in by_kind(runs, "trial")}
    axes = ("model", "loss", "augmentation", "size", "seed")
    for cell in by_kind(runs, "cell"):
        assert {a: cell.data.params[a] for a in axes} == {a: cell.data.tags[a] for a in axes}
        winner = cell.data.tags.get("rerank_lab.winner")
        if winner is None:  # the failing cell: no winner, its axes only
            assert "learning_rate" not in cell.data.params
            continue

        searched = ast.literal_eval(cell.data.tags["winner_params"])  # the winner's Optuna params
        assert "learning_rate" in searched and ("k" in searched) == (cell.data.tags["augmentation"] != "none")
        for name, value in searched.items():
            assert cell.data.params[name.rstrip("_")] == trials[winner].data.params[name.rstrip("_")] == str(value)
    for trial in trials.values():
        assert trial.data.params["learning_rate"] == trial.data.params["searched.learning_rate"]
        assert trial.data.params["model"] == trial.data.tags["model"]
    experiment = client.get_experiment_by_name("tiny-fail")
    description = experiment.tags["mlflow.note.content"]
    assert "**Sweep `tiny-fail`**" in description and "3 cells" in description and "learning_rate" in description


def test_ui_links_land_on_the_sweep_and_compare_its_cells(failing_sweep):
    work, spec, uri, common, failing, plan, report = failing_sweep
    client, runs = mlflow_runs(uri, "tiny-fail")
    tracker = Tracker(uri)
    links = experiment_links(tracker, "tiny-fail", "http://127.0.0.1:5000")
    eid = client.get_experiment_by_name("tiny-fail").experiment_id
    assert links["experiment"] == f"http://127.0.0.1:5000/#/experiments/{eid}?workflowType=machine_learning"
    query = urllib.parse.parse_qs(links["compare the tested cells"].split("?", 1)[1])
    tested = [r.info.run_id for r in by_kind(runs, "cell") if r.info.status == "FINISHED"]
    assert sorted(json.loads(query["runs"][0])) == sorted(tested) and len(tested) >= 2
    assert json.loads(query["experiments"][0]) == [eid] and query["workflowType"] == ["machine_learning"]
    assert "rerank_lab.kind" in urllib.parse.unquote(links["cells"])
    with pytest.raises(InputError, match="no experiment 'nothing-here'"):
        experiment_links(tracker, "nothing-here", "http://127.0.0.1:5000")


def test_the_ui_compares_the_cells_in_a_browser(failing_sweep, tmp_path):
    """`orchestrate ui FILE` in headless Chromium, every link it prints: the experiment's page
    lists the sweep run; the cells' list shows every cell run (the failed one too) and nothing
    else; the cells' comparison lists the grid axes and the searched hyper-parameters as
    parameters and plots a test measure; the screenshots stay in the test's temporary directory."""
    work, spec, uri, *_ = failing_sweep
    _, runs = mlflow_runs(uri, "tiny-fail")
    names = {r.info.run_name for r in runs}
    cell_names = {r.info.run_name for r in by_kind(runs, "cell")}
    assert len(cell_names) == 3 and len(by_kind(runs, "sweep")) == 1  # one of them failed
    with serve_ui(work, spec, uri, free_port()) as links:
        assert set(links) == {"experiment", "cells", "compare the tested cells"}, links
        driver = chromium_driver()
        try:
            # each link loaded afresh (the UI is one page: a new address that differs only after
            # '#' would show the last list until the new one has loaded)
            driver.get("about:blank")
            driver.get(links["experiment"])
            wait_for_rows(driver, names, {"sweep tiny-fail"})  # top level: the sweep run, its cells folded
            driver.save_screenshot(str(tmp_path / "experiment.png"))
            driver.get("about:blank")
            driver.get(links["cells"])
            wait_for_rows(driver, names, cell_names)  # every cell (the failed one too), nothing else
            driver.save_screenshot(str(tmp_path / "cells.png"))
            driver.get("about:blank")
            driver.get(links["compare the tested cells"])
            plotted = wait_for_text(driver, "test/ndcg_at_10", selector="svg text")
            page = driver.find_element("tag name", "body").text
            driver.save_screenshot(str(tmp_path / "compare-cells.png"))
        finally:
            driver.quit()
    assert "\nParameters\n" in page and "\nMetrics\n" in page, page[:3000]
    parameters = page.split("\nParameters\n", 1)[1].split("\nMetrics\n", 1)[0]
    for name in ("model", "loss", "augmentation", "size", "seed", "learning_rate", "lambda", "tau"):
        assert f"\n{name} " in parameters, name  # a row of the compared parameters
    assert "test/ndcg_at_10" in plotted  # the parallel coordinates' metric axis
    assert {"lambda", "learning_rate", "loss"} & set(plotted)  # and hyper-parameter axes beside it
    assert (tmp_path / "compare-cells.png").stat().st_size > 10_000


def wait_for_rows(driver, names: set[str], expected: set[str], timeout: float = 90) -> None:
    """Until the run table lists exactly the runs ``expected`` of the experiment's run ``names``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = driver.execute_script("return Array.from(document.querySelectorAll('[role=row]')).map(e => e.innerText)")
        listed = {line for row in rows for line in row.split("\n") if line in names}
        if listed == expected:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the run table lists {sorted(listed)} after {timeout:.0f} s, not {sorted(expected)}")
        time.sleep(0.5)


def wait_for_text(driver, text: str, selector: str, timeout: float = 60) -> list[str]:
    """The texts of the elements matching ``selector`` once one of them is ``text``."""
    deadline = time.monotonic() + timeout
    while True:
        found = driver.execute_script("return Array.from(document.querySelectorAll(arguments[0])).map(e => e.textContent)",
                                      selector)
        if text in found:
            return found
        if time.monotonic() > deadline:
            body = driver.find_element("tag name", "body").text
            raise AssertionError(f"'{text}' never appeared in {selector} within {timeout:.0f} s; the page reads: {body[:1500]}")
        time.sleep(0.5)
