"""`orchestrate run` with robustness targets on a hand-made WikiQA, then `report --robustness`."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from orchestrator.core.tracking import Tracker
from tests.helpers import run_cli
from tests.workloads.retrieval.test_wikiqa_and_first_stages import write_wikiqa
from workloads.text.perturbations import perturb_queries

pytestmark = pytest.mark.slow  # Ray Train, MLflow: about a minute


def test_run_tests_every_perturbed_set_and_the_report_compares_them_with_clean(tmp_path, tiny_model_dir):
    root = write_wikiqa(tmp_path / "wikiqa")
    base = {"data": {"collection": str(root), "validation_split": "dev"},
            "first_stage": {"method": "given", "train_depth": 10, "validation_depth": 10, "test_depth": 10},
            "training_data": {"size": "full", "negatives": 1}, "model": {"name": str(tiny_model_dir), "max_length": 32},
            "optimization": {"epochs": 1, "learning_rate": 1e-3, "batching": "per_query", "batch_size": 2},
            "robustness": ["punctuation", "typo", "contraction"], "resources": {"workers": 1, "cpus_per_worker": 1}}
    config = {"name": "robust", "base": base, "trials": {"mhl": {"loss": {"ranking": "mhl"}},
                                                          "mhl-tml": {"loss": {"ranking": "mhl", "contrastive": "tml"}}}}
    path = tmp_path / "robust.yaml"
    path.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = dict(os.environ)

    def orchestrate(*args, in_process=False):  # a fresh interpreter for the run; the report reads in process
        if in_process:
            result = run_cli(tmp_path, *args, "--tracking-uri", uri)
        else:
            result = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--tracking-uri", uri], capture_output=True,
                                    text=True, cwd=tmp_path, env=env, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    printed = orchestrate("run", str(path), "--storage", str(tmp_path / "ray"))
    assert "robustness: robust" in printed and "| mhl-tml |" in printed


    client = Tracker(uri).client
    runs = client.search_runs([client.get_experiment_by_name("robust").experiment_id])
    assert len(runs) == 2
    test_queries = {"Q2": "what is a cat", "Q5": "why do dogs bark"}
    for run in runs:
        metrics = run.data.metrics
        for name in ("test", "robust_punctuation", "robust_typo", "robust_contraction"):
            assert f"{name}_ap" in metrics and f"{name}_p_at_1" in metrics and f"bm25_{name}_ap" in metrics
        local = client.download_artifacts(run.info.run_id, "per_query/robust_contraction.json", str(tmp_path))
        contraction = json.loads(open(local).read())["per_query"]["ap"]
        # only "what is a cat" has a contraction variant: the perturbed set is that subset
        assert set(contraction) == set(perturb_queries(test_queries, "contraction")) == {"Q2"}
        assert set(json.loads(open(client.download_artifacts(run.info.run_id, "per_query/robust_typo.json",
                                                             str(tmp_path))).read())["per_query"]["ap"]) == {"Q2", "Q5"}
        # the perturbed queries reached the re-ranker: the texts it was tested on are the variants, not the originals
        def tested_texts(target, run=run):
            path = client.download_artifacts(run.info.run_id, f"queries/{target}.tsv", str(tmp_path / run.info.run_id))
            return dict(line.split("\t") for line in open(path, encoding="utf-8").read().splitlines())

        assert tested_texts("test") == test_queries
        for perturbation in ("punctuation", "typo", "contraction"):
            expected = perturb_queries(test_queries, perturbation)
            assert tested_texts(f"robust_{perturbation}") == expected
            assert all(expected[q] != test_queries[q] for q in expected)

    report = orchestrate("report", str(path), "--robustness", in_process=True)
    assert "clean AP" in report and "contraction P@1" in report and "mhl-tml vs mhl:" in report
    assert "Queries: clean 2, punctuation 2, typo 2, contraction 1." in report
