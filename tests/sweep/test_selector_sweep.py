"""A sweep with a supervised augmentation: the shared selector is trained once, as one
`selector` run under the sweep run, before the cells that use it; a SIGKILL while it trains
resumes it from its last epoch in the same MLflow run."""

import json
import os
import signal
import time

import pytest
import yaml

from tests.helpers import by_kind, mlflow_runs, orchestrate, run_cli, sweep_yaml

pytestmark = pytest.mark.slow  # Ray, Tune and MLflow end to end


# a crash of the driver and the Ray it started: on a shared head the killed driver's workers
# outlive it for a second or two, and this tiny selector's epochs take half a second (seen in CI:
# the orphan finished it, so nothing was left to resume)
@pytest.mark.own_ray
def test_shared_selector_trained_once_and_resumed_after_sigkill(tmp_path, tiny_model_dir, scifact_dir):
    # one trial per cell: the selector is what is killed and resumed
    spec = sweep_yaml(tmp_path / "sel.yaml", tiny_model_dir, "tiny-selector",
                      [{"ranking": "pointwise", "contrastive": "scl"}, {"ranking": "pointwise", "contrastive": "ctriplet"}],
                      trials_per_cell=1)
    config = yaml.safe_load(spec.read_text())
    config["grid"]["augmentations"] = [{"method": "linear", "k": 1, "selector": {
        "k": 2, "epochs": 4, "patience": 4, "warmup_steps": 0, "batch_size": 8, "learning_rate": 1e-3}}]
    config["grid"]["sizes"] = [64]
    spec.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--storage", str(tmp_path / "store"), "--tracking-uri", uri]

    plan = json.loads(run_cli(tmp_path, "sweep", str(spec), "--dry-run", "--json", *common).stdout)
    assert plan["unavailable_cells"] == 0 and plan["selectors_to_train"] == 1
    assert plan["selectors"][0]["cells"] == 2  # scl and ctriplet share it
    assert plan["mlflow_runs_planned"] == 1 + 3 + 3 + 1

    mlflow_runs(uri, "tiny-selector")  # create the store first: two processes migrating a new SQLite DB collide
    driver = orchestrate(tmp_path, "sweep", str(spec), *common, background=True)
    ray_storage = tmp_path / "store" / "tiny-selector" / "ray"
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None and not list(ray_storage.glob("selector-*/epoch-1")):
        time.sleep(0.5)
    assert driver.poll() is None, (tmp_path / "background.err").read_text()[-3000:]
    assert not list(ray_storage.glob("selector-*/epoch-4")), "the selector finished before it could be killed"
    os.killpg(driver.pid, signal.SIGKILL)  # mid selector training: a crash, not a shutdown
    driver.wait()
    _, runs = mlflow_runs(uri, "tiny-selector")
    assert [r.info.status for r in by_kind(runs, "selector")] == ["RUNNING"]

    rerun = orchestrate(tmp_path, "sweep", str(spec), "--json", *common)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert json.loads(rerun.stdout)["selectors_to_train"] == 0
    client, runs = mlflow_runs(uri, "tiny-selector")
    selectors = by_kind(runs, "selector")
    assert len(selectors) == 1 and selectors[0].info.status == "FINISHED"  # the same run, resumed: no duplicate
    selector = selectors[0]
    assert selector.data.tags["mlflow.parentRunId"] == by_kind(runs, "sweep")[0].info.run_id
    assert {"test_ndcg_at_10", "test_ap", "test_rr_at_10", "best_val_ndcg_at_10", "bm25_test_ndcg_at_10"} <= set(selector.data.metrics)
    assert sorted(m.step for m in client.get_metric_history(selector.info.run_id, "epoch_train_seconds")) == [1, 2, 3, 4]
    assert "resumed from" in (tmp_path / "store" / "tiny-selector" / "sweep.log").read_text()
    assert len(by_kind(runs, "cell")) == 3 and len(by_kind(runs, "trial")) == 3
    assert all(r.info.status == "FINISHED" for r in runs)
    installed = selector.data.tags["best_checkpoint"]  # the trained selector, in the shared cache
    assert os.path.basename(installed).startswith("linear-") and os.path.exists(os.path.join(installed, "selector_result.json"))
    report = run_cli(tmp_path, "report", str(spec), "--tracking-uri", uri, "--out", str(tmp_path / "reports"))
    assert report.returncode == 0, report.stderr[-2000:]
    row = next(line for line in report.stdout.splitlines() if line.startswith(f"| {selector.info.run_name} |"))
    assert f"{selector.data.metrics['test_ndcg_at_10']:.4f}" in row and "FINISHED" in row


def test_selectors_train_concurrently_beside_a_cell_that_needs_none(tmp_path, tiny_model_dir, scifact_dir):
    """Two selectors train at the same time (their runs overlap), while the cell without a
    selector runs its trial meanwhile (it starts before either selector ends)."""
    spec = sweep_yaml(tmp_path / "two.yaml", tiny_model_dir, "two-selectors", [{"ranking": "pointwise"}])
    config = yaml.safe_load(spec.read_text())
    selector = {"epochs": 2, "patience": 2, "warmup_steps": 0, "batch_size": 8, "learning_rate": 1e-3}
    config["grid"]["augmentations"] = [{"method": "none"},
                                       {"method": "linear", "k": 1, "selector": {"k": 2, **selector}},
                                       {"method": "linear", "k": 1, "selector": {"k": 3, **selector}}]
    config["base"]["resources"]["cpus_per_worker"] = 0.5  # two selectors and a trial fit a 2-CPU machine
    config["search"]["trials_per_cell"] = 1
    spec.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_cli(tmp_path, "sweep", str(spec), "--json", "--storage", str(tmp_path / "store"), "--tracking-uri", uri,
                     timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    _, runs = mlflow_runs(uri, "two-selectors")
    assert all(r.info.status == "FINISHED" for r in runs)
    selectors = by_kind(runs, "selector")
    assert len(selectors) == 2
    assert max(r.info.start_time for r in selectors) < min(r.info.end_time for r in selectors)  # trained at once
    unaugmented = [r for r in by_kind(runs, "trial") if r.data.tags.get("augmentation") == "none"]
    assert len(unaugmented) == 1 and len(by_kind(runs, "trial")) == 3
    assert unaugmented[0].info.start_time < min(r.info.end_time for r in selectors)  # it did not wait for them
