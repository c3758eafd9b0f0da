"""``orchestrate prepare``: a trial file's or a sweep's data built without training, and reused."""

import json

import pytest
import yaml

from tests.helpers import run_cli, sweep_yaml
from workloads.data.docstore import DocStore
from workloads.kinds import kind_of
from workloads.kinds.rerank.augmentation import scorers
from workloads.kinds.rerank.spec import TrialSpec
from workloads.retrieval import first_stage


def _trial_file(work, tiny_model_dir, **augmentation):
    config = {"name": "prep", "data": {"collection": "beir/scifact", "validation_queries": 5},
              "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
              "training_data": {"size": 16, "seed": 29}, "model": {"name": str(tiny_model_dir), "max_length": 64},
              "robustness": ["typo"], **({"augmentation": augmentation} if augmentation else {})}
    path = work / "prep.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow  # builds real data through the CLI
def test_prepare_builds_a_trial_files_data_once_and_a_rerun_reuses_all_of_it(tmp_path, tiny_model_dir, scifact_dir,
                                                                              monkeypatch):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "cache"))  # nothing built before
    path = _trial_file(tmp_path, tiny_model_dir)
    first = run_cli(tmp_path, "prepare", str(path), "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    built = json.loads(first.stdout)
    # the index, three first-stage runs, the training set, validation and test candidates, the perturbed test's
    assert built["units"] == 1 and built["complete"] == 1 and built["files_built"] >= 6
    assert "prepared [1/1] prep" in first.stderr
    again = json.loads(run_cli(tmp_path, "prepare", str(path), "--json").stdout)
    assert again["files_built"] == 0 and again["complete"] == 1
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / ".orchestrate").exists()  # nothing tracked or trained


@pytest.mark.slow  # builds real data through the CLI
def test_prepare_says_which_trials_wait_for_a_selector(tmp_path, tiny_model_dir, scifact_dir):
    path = _trial_file(tmp_path, tiny_model_dir, method="linear", k=2)
    result = run_cli(tmp_path, "prepare", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "prep waits:" in result.stdout and "linear selector is not trained yet" in result.stdout


@pytest.mark.slow  # builds real data through the CLI
def test_prepare_takes_a_sweep_a_unit_per_runnable_cell(tmp_path, tiny_model_dir, scifact_dir):
    spec = sweep_yaml(tmp_path / "tiny.yaml", tiny_model_dir, "tiny-prepare", [{"ranking": "pointwise", "contrastive": "scl"}])
    plan = json.loads(run_cli(tmp_path, "sweep", str(spec), "--dry-run", "--json", "--storage", str(tmp_path / "store")).stdout)
    result = run_cli(tmp_path, "prepare", str(spec), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["units"] == plan["runnable_cells"] == 2  # the baseline and the scl cell


def test_prepare_of_a_missing_file_is_one_line_and_exit_2(tmp_path):
    result = run_cli(tmp_path, "prepare", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2 and "absent.yaml" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_warm_preparation_reads_no_document_and_not_the_training_run(tiny_model_dir, scifact_dir, monkeypatch):
    """What a trial's process does with everything prepared: open files by key; no document is
    read (the corpus store counts), no first-stage run is read (the training split's can be
    millions of lines), nothing is split or scored again."""
    spec = TrialSpec.model_validate({
        "name": "warm", "data": {"collection": "beir/scifact", "validation_queries": 5},
        "first_stage": {"train_depth": 10, "validation_depth": 5, "test_depth": 3},
        "training_data": {"size": 16, "seed": 31}, "model": {"name": str(tiny_model_dir), "max_length": 64},
        "augmentation": {"method": "bm25", "k": 2}})
    cold = kind_of(spec).prepare(spec)
    reads, runs_read = DocStore.reads, []
    real_read = first_stage.read_trec_run
    monkeypatch.setattr(first_stage, "read_trec_run", lambda path: runs_read.append(path) or real_read(path))
    monkeypatch.setattr(first_stage.FirstStageRun, "rankings", lambda self, ids: runs_read.append(self.path) or iter(()))
    monkeypatch.setattr(scorers.SentenceStatistics, "of", lambda *a: pytest.fail("computed corpus statistics again"))
    warm = kind_of(spec).prepare(spec)
    assert warm == cold and DocStore.reads == reads and runs_read == []  # baselines' evaluations are stored too
