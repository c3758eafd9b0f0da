"""Every evaluation target of a sweep is held out from its training and validation queries, checked
before anything is prepared: by configuration when the file loads, by the queries in --dry-run."""

from pathlib import Path

import pytest
import yaml

from orchestrator.core.config import load_trials, read_yaml
from orchestrator.lifecycle.targets import target_overlap, targets
from orchestrator.sweep.grid import check_targets, expand_grid, load_sweep
from tests.helpers import run_cli
from workloads.core.errors import InputError
from workloads.data.resolve import resolve_collection
from workloads.kinds import kind_named
from workloads.kinds.ear.spec import EarTrialSpec, is_ear_file

REPO = Path(__file__).resolve().parents[2]
SWEEPS = sorted((REPO / "search_spaces").glob("*.yaml"))  # sweeps at the top, trial files in trials/
TRIAL_FILES = sorted((REPO / "search_spaces" / "trials").glob("*.yaml"))


def test_sweeps_and_trial_files_are_told_apart_by_their_folder():
    assert len(SWEEPS) >= 4 and len(TRIAL_FILES) >= 5
    assert all("grid" in yaml.safe_load(p.read_text()) for p in SWEEPS), "a file at the top is not a sweep"
    assert not any("grid" in yaml.safe_load(p.read_text()) for p in TRIAL_FILES), "a trial file is a sweep"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_tests_on_held_out_queries(path):
    sweep = load_sweep(path)  # by configuration
    check_targets(sweep, expand_grid(sweep))  # and by the queries of the local collections


@pytest.mark.parametrize("path", TRIAL_FILES, ids=lambda p: p.stem)
def test_every_shipped_trial_file_tests_on_held_out_queries(path):
    if is_ear_file(read_yaml(path)[0]):  # an EAR trial tests on its own test split, by configuration apart
        _, specs = load_trials(path, EarTrialSpec)
        for spec in specs:
            collection = resolve_collection(spec.data.collection)
            assert not set(collection.split_qrels(spec.data.test_split)) & set(collection.split_qrels(spec.data.train_split))
        return
    _, specs = load_trials(path, kind_named(read_yaml(path)[0].get("kind")).spec)  # by configuration, as its kind reads it
    for spec in specs:
        for target in targets(spec):
            assert target_overlap(spec, target) is None  # and by the queries of the local collections


def test_the_shipped_files_are_sweeps_and_trial_files():
    assert {p.stem for p in SWEEPS} >= {"demo", "doc19", "sir-doc19", "selectors-scifact"}
    assert {p.stem for p in TRIAL_FILES} >= {"trial-scifact", "cft-wikiqa"}


def _dry_run(tmp_path, config: dict):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = run_cli(tmp_path, "sweep", str(path), "--dry-run", "--storage", str(tmp_path / "store"))
    return path, proc


def _wikiqa_sweep(zero_shot: list[dict]) -> dict:
    return {"name": "held-out",
            "base": {"data": {"collection": "wikiqa", "validation_split": "dev", "test_split": "test-answered"},
                     "first_stage": {"method": "given"}, "training_data": {"negatives": 1}},
            "grid": {"models": ["minilm-l6"], "losses": [{"ranking": "pointwise"}], "augmentations": [{"method": "none"}],
                     "sizes": [100]},
            "search": {"trials_per_cell": 1}, "zero_shot": zero_shot}


def test_a_zero_shot_target_equal_to_the_validation_split_fails_the_dry_run_at_its_line(tmp_path):
    path, proc = _dry_run(tmp_path, _wikiqa_sweep([{"collection": "wikiqa", "split": "dev"}]))
    line = [i for i, text in enumerate(path.read_text().splitlines(), 1) if "- collection: wikiqa" in text][-1]
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}:{line}: target wikiqa:dev is the validation split 'dev' of wikiqa: the model is chosen on it: "
        "a test must be held out (choose another split or collection)"]
    assert not (tmp_path / "store").exists()  # a dry run writes nothing


def test_a_target_that_shares_queries_with_validation_is_found_by_its_query_ids(tmp_path):
    config = _wikiqa_sweep([{"collection": "wikiqa", "split": "dev-answered"}])  # 122 of dev's 122 questions
    load_sweep_ok = tmp_path / "ok.yaml"
    load_sweep_ok.write_text(yaml.safe_dump(config))
    load_sweep(load_sweep_ok)  # a different split name: configuration alone cannot tell
    path, proc = _dry_run(tmp_path, config)
    assert proc.returncode == 2, proc.stdout
    assert "target wikiqa:dev-answered shares 122 queries with the validation split 'dev' of wikiqa" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_trial_spec_keeps_refusing_a_test_split_that_is_its_validation_split(tmp_path):
    config = _wikiqa_sweep([])
    config["base"]["data"]["test_split"] = "dev"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(InputError, match="validation_split and test_split are both 'dev'"):
        load_sweep(path)
