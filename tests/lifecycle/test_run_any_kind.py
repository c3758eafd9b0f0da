"""``orchestrate run`` asks a trial's kind, never its name: what would stop a trial includes
what would stop the trials it requires (an EAR first stage's EAR trial), and a kind whose
result is kept outside the run store refuses ``--force`` in one line, writing nothing."""

import yaml

from tests.cli.test_offline import assert_one_clear_line
from tests.helpers import run_cli
from tests.workloads.kinds.ear.test_expansion import ear_world  # noqa: F401 - the fixture


def test_a_dry_run_lists_what_would_stop_the_trials_it_requires(ear_world, tmp_path, monkeypatch):  # noqa: F811
    root, _, config = ear_world
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    generated = {**config, "expansion": {"source": "generator", "model": "some-org/not-cached-generator", "n": 2}}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(generated))
    rerank = {"name": "r", "data": {"collection": str(root), "validation_queries": 8}, "model": config["model"],
              "first_stage": {"method": "ear", "run": "gen.yaml"}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rerank))
    proc = run_cli(tmp_path, "run", "r.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("trial r (identity ")
    stops = [line for line in proc.stdout.splitlines() if "would stop before it computes" in line]
    assert len(stops) == 1 and "expansion.model some-org/not-cached-generator" in stops[0], proc.stdout[:2000]


def test_force_on_a_kept_result_is_one_line(ear_world, tmp_path):  # noqa: F811
    _, ear_file, _ = ear_world
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    assert_one_clear_line(run_cli(tmp_path, "run", str(ear_file), "--force", "--tracking-uri", uri),
                          "--force", "an EAR trial's result is kept in the cache")
    assert not (tmp_path / "m.db").exists()
