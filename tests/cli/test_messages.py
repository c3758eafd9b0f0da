"""Messages read exactly (issue 59): a kind a file names that no kind is, a trial file given to a
command that takes a sweep file; what the dense kind's preflight and preparation say."""

import pytest
import yaml

from orchestrator.lifecycle import preparation
from orchestrator.lifecycle.preparation import Unit, fetch_models
from tests.helpers import run_cli
from workloads.kinds.dense.spec import DenseTrialSpec


def error_line(proc) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_trial_kind_in_the_wrong_case_is_named_unknown_with_the_kinds_and_the_right_spelling(tmp_path):
    (tmp_path / "t.yaml").write_text("name: t\nkind: Dense\ndata: {collection: beir/scifact}\nmodel: {towers: shared}\n")
    assert error_line(run_cli(tmp_path, "run", "t.yaml", "--dry-run")) == (
        "error: t.yaml:2: kind: unknown trial kind 'Dense' (a file names kind: dense, ear; a re-ranking trial names none): "
        "did you mean 'dense'?")


def test_a_sweeps_base_kind_that_is_no_kind_is_named_unknown(tmp_path):
    sweep = {"name": "s", "base": {"kind": "colbert", "data": {"collection": "beir/scifact"}}, "grid": {"models": ["m"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep, sort_keys=False))
    assert error_line(run_cli(tmp_path, "sweep", "s.yaml", "--dry-run")) == (
        "error: s.yaml:3: base.kind: unknown trial kind 'colbert' (a file names kind: dense, ear; a re-ranking trial "
        "names none)")


@pytest.mark.parametrize("command", ["report", "status"])
def test_a_trial_file_given_to_a_sweep_command_says_so(tmp_path, command):
    trial = {"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "minilm-l6"}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(trial))
    assert error_line(run_cli(tmp_path, command, "t.yaml")) == (
        f"error: t.yaml: a trial file, not a sweep file (it has no grid): `orchestrate {command}` takes a sweep file "
        "(name, base, grid, search); `orchestrate run` runs a trial file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # nothing written


# ----------------------------------------------------------------------------- the dense kind's preflight
OFFLINE = ("not in the local Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1): give a local model directory or an "
           "alias (minilm-l6), or download it first on a connected machine (huggingface-cli download {})")


def dense_trial(tmp_path, **changes):
    trial = {"name": "d", "kind": "dense", "data": {"collection": "beir/scifact", "validation_queries": 5},
             "model": {"name": "minilm-l6"}, "dense": {"objective": "diffcse", "generator": "distilbert-base-uncased"},
             **changes}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(trial, sort_keys=False))
    return "d.yaml"


def test_a_dense_dry_run_lists_an_unknown_encoder_a_missing_collection_and_an_uncached_generator(tmp_path):
    trial = dense_trial(tmp_path, data={"collection": "beir/not-here", "validation_queries": 5},
                        model={"name": "bert-not-cached"}, first_stage={"method": "run", "path": "absent.trec"})
    proc = run_cli(tmp_path, "run", trial, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    stops = [line.removeprefix("  would stop before it computes: ") for line in proc.stdout.splitlines()
             if line.startswith("  would stop")]
    assert stops == ["model.name bert-not-cached: " + OFFLINE.format("bert-not-cached"),
                     "dense.generator distilbert-base-uncased: " + OFFLINE.format("distilbert-base-uncased"),
                     "beir/not-here: unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, not an "
                     "ir_datasets id",
                     "absent.trec: first_stage path: no such run file"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.yaml"]


@pytest.mark.parametrize("command", ["prepare", "run"])
def test_prepare_and_run_refuse_an_uncached_generator_before_any_worker(tmp_path, command):
    proc = run_cli(tmp_path, command, dense_trial(tmp_path))
    assert error_line(proc) == "error: dense.generator distilbert-base-uncased: " + OFFLINE.format("distilbert-base-uncased")


def test_the_frequency_generator_is_no_model_to_check(tmp_path):
    proc = run_cli(tmp_path, "run", dense_trial(tmp_path, dense={"objective": "diffcse"}), "--dry-run")
    assert proc.returncode == 0 and "would stop" not in proc.stdout, proc.stdout + proc.stderr


def test_prepare_fetches_the_generator_with_the_encoder(tmp_path, monkeypatch):
    fetched = []
    monkeypatch.setattr(preparation, "fetch_model", lambda name, field: fetched.append((name, field)))
    spec = DenseTrialSpec.model_validate(yaml.safe_load((tmp_path / dense_trial(tmp_path)).read_text()))
    fetch_models([Unit("d", (spec, spec))])
    assert fetched == [("minilm-l6", "model.name"), ("distilbert-base-uncased", "dense.generator")]


# ----------------------------------------------------------------------------- a re-ranking trial's preflight
def test_a_rerank_dry_run_lists_a_missing_cross_encoder_and_a_fusion_weight_without_a_train_split(tmp_path):
    target = tmp_path / "tiny"  # a zero-shot target without a train split
    (target / "qrels").mkdir(parents=True)
    (target / "corpus.jsonl").write_text('{"_id": "d1", "text": "cats purr"}\n{"_id": "d2", "text": "dogs bark"}\n')
    (target / "queries.jsonl").write_text('{"_id": "q1", "text": "what purrs"}\n')
    (target / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    trial = {"name": "r", "data": {"collection": "beir/scifact", "validation_queries": 5, "test_collection": str(target)},
             "model": {"name": "minilm-l6"}, "loss": {"ranking": "margin_mse"},
             "training_data": {"mining": {"method": "cross_encoder", "model": str(tmp_path / "no-checkpoint")}}}
    trial["data"]["test_first_stage"] = {"method": "hybrid", "model": "minilm-l6", "fusion": "interpolation"}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(trial, sort_keys=False))
    proc = run_cli(tmp_path, "run", "r.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    stops = [line.removeprefix("  would stop before it computes: ") for line in proc.stdout.splitlines()
             if line.startswith("  would stop")]
    assert stops == [f"training_data.mining.model: '{tmp_path / 'no-checkpoint'}': give a kept cross-encoder's checkpoint "
                     "directory",
                     f"{target}: hybrid interpolation tunes its weight on the 'train' split's queries and this collection has "
                     "none: give first_stage.fusion_weight, or fusion: rrf"]


# ----------------------------------------------------------------------------- an EAR first stage trained on other data
def _ear_pair(tmp_path, ear_data: dict, trial_data: dict) -> str:
    (tmp_path / "ear.yaml").write_text(yaml.safe_dump({"kind": "ear", "name": "e", "model": {"name": "minilm-l6"},
                                                       "data": {"collection": "beir/scifact", **ear_data}}))
    trial = {"name": "r", "model": {"name": "minilm-l6"}, "first_stage": {"method": "ear", "run": "ear.yaml"},
             "data": {"collection": "beir/scifact", **trial_data}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(trial, sort_keys=False))
    return "r.yaml"


def test_an_ear_first_stage_trained_on_this_trials_validation_queries_is_refused(tmp_path):
    proc = run_cli(tmp_path, "run", _ear_pair(tmp_path, {"validation_queries": 20}, {"validation_queries": 50}), "--dry-run")
    assert error_line(proc).endswith(
        "the EAR trial carves 20 validation queries from train and trained on the rest, and this trial carves 50 from "
        "train: it would validate on queries the EAR first stage trained on (give both the same data.validation_queries)")


def test_an_ear_first_stage_with_the_same_validation_is_accepted(tmp_path):
    proc = run_cli(tmp_path, "run", _ear_pair(tmp_path, {"validation_queries": 20}, {"validation_queries": 20}), "--dry-run")
    assert proc.returncode == 0, proc.stderr


def test_an_ear_first_stage_validated_otherwise_without_overlap_is_one_warning(tmp_path):
    beir = tmp_path / "tiny"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(f'{{"_id": "d{i}", "text": "text {i}"}}\n' for i in range(16)))
    (beir / "queries.jsonl").write_text("".join(f'{{"_id": "q{i}", "text": "query {i}"}}\n' for i in range(16)))
    for split, ids in (("train", range(0, 8)), ("dev", range(8, 14)), ("test", range(14, 16))):
        (beir / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in ids))
    (tmp_path / "ear.yaml").write_text(yaml.safe_dump({"kind": "ear", "name": "e", "model": {"name": "minilm-l6"},
                                                       "data": {"collection": str(beir), "validation_split": "dev",
                                                                "validation_cap": 5}}))
    trial = {"name": "r", "model": {"name": "minilm-l6"}, "first_stage": {"method": "ear", "run": "ear.yaml"},
             "data": {"collection": str(beir), "validation_split": "dev"}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(trial, sort_keys=False))
    proc = run_cli(tmp_path, "run", "r.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "validated on other queries" in line]
    assert len(warned) == 1 and warned[0].endswith(
        f"EAR first stage {tmp_path / 'ear.yaml'} was validated on other queries than this trial's (dev capped at 5): its candidates "
        "are not chosen on this trial's validation"), proc.stderr
