"""EAR through the commands: a re-ranking trial whose first stage is an EAR trial trains that
trial first (one tracked run of kind ear) and re-ranks what it retrieved; the EAR file alone
prints its comparison; a sweep's dry run lists it; bad input is one line."""

import json

import pytest
import yaml

from tests.cli.test_offline import assert_one_clear_line
from tests.helpers import by_kind, mlflow_runs, run_cli
from tests.workloads.kinds.ear.test_expansion import ear_world  # noqa: F401 - the fixture
from workloads.evaluation import evaluate
from workloads.kinds.ear.spec import RUN_FILE, load_ear_trial, trained_ear
from workloads.retrieval.bm25 import read_trec_run


@pytest.mark.slow
def test_a_trial_after_ear_trains_it_first_and_reranks_what_it_retrieved(ear_world, tmp_path):  # noqa: F811

    root, ear_file, config = ear_world
    rerank = {"name": "after-ear", "data": {"collection": str(root), "validation_queries": 8},
              "first_stage": {"method": "ear", "run": ear_file.name, "train_depth": 5, "validation_depth": 5,
                              "test_depth": 3},
              "training_data": {"size": 20}, "model": config["model"],
              "optimization": {"epochs": 1, "batch_size": 4, "precision": "fp32"}, "resources": {"cpus_per_worker": 1}}
    (tmp_path / "after-ear.yaml").write_text(yaml.safe_dump(rerank))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = ("--tracking-uri", uri, "--storage", str(tmp_path / "ray"))
    proc = run_cli(tmp_path, "run", "after-ear.yaml", *store, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = mlflow_runs(uri, "after-ear")
    ear_runs, trials = by_kind(runs, "ear"), by_kind(runs, "trial")
    assert [r.info.status for r in ear_runs] == ["FINISHED"] and [r.info.status for r in trials] == ["FINISHED"]
    assert ear_runs[0].data.tags["reranker"] == "ri" and "test_recall_at_100" in ear_runs[0].data.metrics

    spec = load_ear_trial(str(ear_file))
    kept = read_trec_run(trained_ear(spec) / RUN_FILE)
    test_qrels = {f"q{i}": {f"d{i}": 1} for i in range(40, 60)}
    ear_test = evaluate({q: kept[q] for q in test_qrels}, test_qrels, 1)
    # the trial's first stage on its test queries is EAR's run: the same nDCG@10
    assert trials[0].data.metrics["bm25_test_ndcg_at_10"] == pytest.approx(ear_test.aggregate["ndcg_at_10"])

    proc = run_cli(tmp_path, "run", str(ear_file), *store, "--json")  # kept: reused, its comparison printed
    assert proc.returncode == 0, proc.stderr[-3000:]
    systems = json.loads(proc.stdout)["trials"][0]["systems"]
    assert list(systems) == ["bm25", "rm3", "first", "concatenated", "ear-ri", "oracle"]
    assert systems["ear-ri"]["metrics"]["ndcg_at_10"] == pytest.approx(ear_test.aggregate["ndcg_at_10"])
    assert 0 <= systems["ear-ri"]["p_value_vs_rm3"] <= 1 and systems["bm25"]["p_value_vs_bm25"] is None
    _, runs = mlflow_runs(uri, ear_file.stem)
    assert by_kind(runs, "ear") == []  # reused from the cache: not trained or tracked again

    # the kept reranker choosing among a split's expansions anywhere: on its own test split, its test
    proc = run_cli(tmp_path, "expand", "--dataset", str(root), "--split", "test", "--source", "file", "--path",
                       config["expansion"]["path"], "--n", "4", "--depth", "10", "--ear", str(ear_file), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    expanded = json.loads(proc.stdout)["systems"]
    assert list(expanded) == ["bm25", "rm3", "first", "concatenated", "ear-ri:ear-world", "oracle"]
    assert expanded["ear-ri:ear-world"]["metrics"]["ndcg_at_10"] == pytest.approx(ear_test.aggregate["ndcg_at_10"])

    sweep = {"name": "after-ear-grid", "base": {k: v for k, v in rerank.items() if k not in ("name", "model", "training_data")},
             "grid": {"models": [config["model"]["name"]], "max_length": 32, "losses": [{"ranking": "pointwise"}],
                      "augmentations": [{"method": "none"}], "sizes": [20]},
             "search": {"trials_per_cell": 1}}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(sweep))
    proc = run_cli(tmp_path, "sweep", "grid.yaml", "--dry-run", "--json", *store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert [(e["name"], e["trained"], e["cells"]) for e in plan["ear_trials"]] == [("ear-world", True, 1)]


def test_ear_files_bad_input_is_one_line(ear_world, tmp_path, monkeypatch):  # noqa: F811
    root, ear_file, config = ear_world
    proc = run_cli(tmp_path, "run", str(ear_file), "--dry-run")
    assert proc.returncode == 0 and "EAR trial ear-world (identity " in proc.stdout, proc.stderr[-2000:]

    (root / "expansions.jsonl").write_text((root / "expansions.jsonl").read_text() +
                                           json.dumps({"query_id": "q999", "expansion": "x"}) + "\n")
    assert_one_clear_line(run_cli(tmp_path, "run", str(ear_file), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"),
                          "expansions.jsonl", "1 query ids are not queries of")
    assert not (tmp_path / "m.db").exists()  # nothing written before the inputs are known good

    generated = {**config, "expansion": {"source": "generator", "model": "some-org/not-cached-generator", "n": 2}}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(generated))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_one_clear_line(run_cli(tmp_path, "run", "gen.yaml"), "expansion.model some-org/not-cached-generator",
                          "not in the local Hugging Face cache")

    rerank = {"name": "r", "data": {"collection": str(root)}, "model": config["model"],
              "first_stage": {"method": "ear", "run": "missing.yaml"}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rerank))
    assert_one_clear_line(run_cli(tmp_path, "run", "r.yaml"), "missing.yaml", "no such EAR trial file")


@pytest.mark.slow
def test_an_ear_sweep_searches_each_cell_tests_and_keeps_its_winner_and_resumes_without_new_runs(ear_world, tmp_path):  # noqa: F811
    """An EAR grid as a sweep: Optuna draws alpha, n and the learning rate per trial; the winner
    is tested by BM25 with the expansions it chooses, kept (its trial file is an artifact and is
    found trained), and a rerun starts nothing."""
    root, _, config = ear_world
    base = {k: v for k, v in config.items() if k not in ("name", "model")}
    base["ear"] = {k: v for k, v in config["ear"].items() if k != "reranker"} | {"epochs": 2}
    base["resources"] = {"cpus_per_worker": 1}
    sweep = {"name": "ear-grid", "base": base,
             "grid": {"models": [config["model"]["name"]], "rerankers": ["ri"], "max_length": 32},
             # the default (Wilcoxon) pruner, asked every epoch, never prunes at this p: 8 queries
             # reach one-sided p = 1/256 at best, so both trials train both epochs, whichever order they run in
             "search": {"trials_per_cell": 2, "alpha": {"choices": [0.05, 0.2]}, "n": {"choices": [3, 4]},
                        "learning_rate": {"choices": [1e-3]}, "wilcoxon_p": 0.001}}
    (tmp_path / "ear-grid.yaml").write_text(yaml.safe_dump(sweep))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = ("--tracking-uri", uri, "--storage", str(tmp_path / "sweeps"))

    proc = run_cli(tmp_path, "sweep", "ear-grid.yaml", "--dry-run", "--json", *store)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout)
    assert (plan["runnable_cells"], plan["trials_to_run"], plan["mlflow_runs_runnable"]) == (1, 2, 4)
    assert plan["cells_detail"][0]["loss"] == "ear-ri" and plan["cells_detail"][0]["searched"] == [
        "learning_rate", "alpha", "max_rank", "n"]

    proc = run_cli(tmp_path, "sweep", "ear-grid.yaml", *store, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = mlflow_runs(uri, "ear-grid")
    trials, cells = by_kind(runs, "trial"), by_kind(runs, "cell")
    assert sorted(r.info.status for r in trials) == ["FINISHED", "FINISHED"] and len(cells) == 1 and len(runs) == 4
    drawn = {(r.data.params["ear.alpha"], r.data.params["expansion.n"]) for r in trials}
    assert len(drawn) == 2  # two distinct parameter sets, each an EAR trial of its own
    # the default (Wilcoxon) pruner got each epoch's 8 validation queries through Ray Train and Tune,
    # kept where a resumed driver reads them
    kept_values = [json.loads(path.read_text()) for path in (tmp_path / "sweeps" / "ear-grid" / "ray" / "per_query").glob("*.json")]
    assert len(kept_values) == 2 and all(sorted(v) == ["1", "2"] and all(len(q) == 8 for q in v.values()) for v in kept_values)
    cell = cells[0]
    assert cell.info.status == "FINISHED" and cell.data.tags["loss"] == "ear-ri"
    winner = next(r for r in trials if r.info.run_id == cell.data.tags["rerank_lab.winner"])
    assert winner.data.metrics["best_val_ndcg_at_10"] == max(r.data.metrics["best_val_ndcg_at_10"] for r in trials)

    # the winner is kept as the EAR trial of its parameters: its file (an artifact) finds it trained
    trial_file = tmp_path / "winner.yaml"
    trial_file.write_text(client.download_artifacts(cell.info.run_id, "ear_trial.yaml", str(tmp_path)) and
                          (tmp_path / "ear_trial.yaml").read_text())
    winner_spec = load_ear_trial(str(trial_file))
    assert (winner_spec.ear.alpha, winner_spec.expansion.n) == (float(winner.data.params["ear.alpha"]),
                                                                 int(winner.data.params["expansion.n"]))
    kept = trained_ear(winner_spec)
    assert kept is not None and cell.data.tags["rerank_lab.kept"] == str(kept)
    # the cell's test is BM25 with the expansions the winner chooses: the kept run on the test queries
    test_qrels = {f"q{i}": {f"d{i}": 1} for i in range(40, 60)}
    run = read_trec_run(kept / RUN_FILE)
    assert cell.data.metrics["test_ndcg_at_10"] == pytest.approx(
        evaluate({q: run[q] for q in test_qrels}, test_qrels, 1).aggregate["ndcg_at_10"])
    assert "bm25_test_ndcg_at_10" in cell.data.metrics  # the first stage beside it

    proc = run_cli(tmp_path, "status", "ear-grid.yaml", *store, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout)
    assert (status["cells_done"], status["trials_finished"], status["trials_to_run"]) == (1, 2, 0)
    proc = run_cli(tmp_path, "report", "ear-grid.yaml", *store, "--cols", "loss", "--out", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ear-ri / file" in proc.stdout and f"{cell.data.metrics['test_ndcg_at_10']:.4f}" in proc.stdout
    assert "no baseline cell" in proc.stdout and "against the baseline" not in proc.stdout  # nothing to compare with

    proc = run_cli(tmp_path, "sweep", "ear-grid.yaml", *store)  # done: resumed, nothing new
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, again = mlflow_runs(uri, "ear-grid")
    assert len(again) == 4 and {r.info.run_id for r in again} == {r.info.run_id for r in runs}
