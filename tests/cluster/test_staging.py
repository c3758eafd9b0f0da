"""Before a cluster's sweep: every prebuilt index name of a grid resolves in the catalog of the
Anserini bundled with Pyserini, and every local file a trial reads lies on the storage the workers
mount ($ORCHESTRATE_SHARED_DIR). Offline: the catalog is read from Pyserini's jar."""

import json
import os
from pathlib import Path

import pytest
import yaml

from orchestrator.core.staging import index_names, staging_problems
from orchestrator.sweep.grid import load_sweep, sweep_specs
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
DOC19 = REPO / "search_spaces" / "doc19.yaml"
ROBUST04 = {"collection": "disks45/nocr/trec-robust-2004", "split": "test"}


@pytest.fixture()
def data_dir() -> Path:
    return Path(os.environ["ORCHESTRATE_DATA_DIR"]).resolve()


def doc19_with(tmp_path: Path, **changes) -> Path:
    spec = yaml.safe_load(DOC19.read_text())
    spec.update(changes)
    path = tmp_path / "doc19.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_every_doc19_index_name_resolves_and_every_local_file_is_staged(data_dir, shared_cache):
    specs = sweep_specs(load_sweep(DOC19))
    names = {name for spec in specs for _, _, name in index_names(spec)}
    # msmarco-v1-doc for training and TREC-DL 2019, BEIR's flat indexes for the five zero-shot targets
    assert names == {"msmarco-v1-doc", *(f"beir-v1.0.0-{n}.flat" for n in ("scifact", "fiqa", "dbpedia-entity", "trec-covid", "nfcorpus"))}
    # the workers mount the data and the cache (on a cluster: /mnt/shared/data and /mnt/shared/cache)
    assert staging_problems(specs, shared=[data_dir, shared_cache.resolve()]) == []


def test_robust04_would_stop_preparation_and_is_named(tmp_path):
    sweep = load_sweep(doc19_with(tmp_path, zero_shot=[*yaml.safe_load(DOC19.read_text())["zero_shot"], ROBUST04]))
    problems = staging_problems(sweep_specs(sweep), shared=[])
    assert len(problems) == 1
    assert problems[0].startswith("disks45/nocr/trec-robust-2004: first_stage.index: 'robust04' is not a prebuilt index")
    assert "beir-v1.0.0-robust04.flat" in problems[0]


def test_what_the_workers_storage_lacks_is_listed(data_dir, shared_cache, tmp_path):
    specs = sweep_specs(load_sweep(DOC19))
    problems = staging_problems(specs, shared=[shared_cache.resolve()])  # the data directory is not shared
    unstaged = sorted(p.split(": ", 1)[0] for p in problems)
    assert unstaged == sorted(str(p) for p in (data_dir / "glove" / "glove.6B.50d.top100k.txt.gz", data_dir / "scifact",
                                                   data_dir / "nfcorpus"))
    assert all("is not on the workers' storage" in p for p in problems)


def test_a_cache_off_the_shared_volume_is_named(data_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("ORCHESTRATE_CACHE_DIR", str(tmp_path / "node-local-cache"))
    problems = staging_problems(sweep_specs(load_sweep(DOC19)), shared=[data_dir])
    assert problems == [f"ORCHESTRATE_CACHE_DIR={tmp_path / 'node-local-cache'}: not on the workers' storage "
                        f"(ORCHESTRATE_SHARED_DIR={data_dir}): the workers would not see what the driver prepares and downloads there"]


def test_doc19_dry_run_on_the_cluster_reports_no_index_or_staging_problem(data_dir, shared_cache):
    env = dict(os.environ, ORCHESTRATE_SHARED_DIR=f"{data_dir}:{shared_cache}")
    proc = run_cli(REPO, "sweep", str(DOC19), "--dry-run", "--json", "--storage", str(shared_cache / "sweeps"),
                   env={"ORCHESTRATE_SHARED_DIR": env["ORCHESTRATE_SHARED_DIR"]})
    assert proc.returncode == 0, proc.stderr
    preflight = json.loads(proc.stdout)["preflight"]
    # (offline, the models not downloaded yet are named: that is the preflight's, not staging's)
    assert not [p for p in preflight if "prebuilt index" in p or "workers' storage" in p], preflight


def test_prepare_refuses_an_unknown_index_name_before_preparing_anything(tmp_path, shared_cache):
    path = doc19_with(tmp_path, zero_shot=[ROBUST04])
    before = sorted(shared_cache.rglob("*"))
    proc = run_cli(tmp_path, "prepare", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "'robust04' is not a prebuilt index" in proc.stderr
    assert "Traceback" not in proc.stderr and sorted(shared_cache.rglob("*")) == before


def test_a_sweep_refuses_an_unstaged_file_before_it_writes_anything(tmp_path, data_dir, shared_cache):
    env = dict(os.environ, ORCHESTRATE_SHARED_DIR=str(shared_cache))  # the data directory is not on the workers' storage
    storage = tmp_path / "store"
    proc = run_cli(tmp_path, "sweep", str(DOC19), "--storage", str(storage), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                   env={"ORCHESTRATE_SHARED_DIR": env["ORCHESTRATE_SHARED_DIR"]})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "is not on the workers' storage" in proc.stderr
    assert not storage.exists() and not (tmp_path / "mlflow.db").exists()
