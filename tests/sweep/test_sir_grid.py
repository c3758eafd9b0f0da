"""SIR in sweep grids: V0 is the baseline cell, each curriculum a column of the loss axis."""

import json
from pathlib import Path

import optuna
import pytest
import yaml

from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.search import sample
from tests.helpers import by_kind, mlflow_runs, run_cli
from workloads.kinds import kind_of

REPO = Path(__file__).resolve().parents[2]


def test_sir_doc19_dry_run_lists_v0_and_the_variants_per_model():
    proc = run_cli(REPO, "sweep", str(REPO / "search_spaces" / "sir-doc19.yaml"), "--dry-run", "--json", "--storage",
                   "/tmp/rerank-lab-dry-run")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    # 2 models x (V0 baseline + v1/v2: 5 columns + v3/v4 x top/random x 3/4 levels) = 28 cells per seed, x 3 seeds
    # (what the report's calibration asks for), 3 trials each
    assert (plan["cells"], plan["baseline_cells"], plan["trials_planned"], plan["unavailable_cells"]) == (84, 6, 252, 0)
    losses = {c["loss"] for c in plan["cells_detail"]}
    staged = {"sir@v1[48-16,random]", "sir@v1[48-16]", "sir@v2[48-16,random]", "sir@v2[48-16]", "sir@v2[48-16-8,random]"}
    assert losses == {"sir"} | staged | {f"sir@{v}[{levels}{sel}]" for v in ("v3", "v4") for levels in ("48-16", "48-16-8")
                                         for sel in ("", ",random")}
    searched = {c["loss"]: c["searched"] for c in plan["cells_detail"]}
    assert searched["sir"] == ["learning_rate"] and searched["sir@v1[48-16]"] == ["learning_rate", "sir_levels"]


def _sweep(**grid) -> SweepSpec:
    base = {"data": {"collection": "c"}, "training_data": {"negatives": 7},
            "optimization": {"batching": "per_query", "batch_size": 16}}
    return SweepSpec.model_validate({"name": "s", "base": base, "grid": {"models": ["m"], "sizes": [800],
                                                                         "augmentations": [{"method": "none"}], **grid}})


def test_a_cells_trial_carries_its_curriculum_and_the_trial_axes_match_the_cell():
    cells = expand_grid(_sweep(baseline_ranking="sir", losses=[{"ranking": "sir", "sir": {"variant": "v4", "levels": [4, 2]}}]))
    baseline, v4 = cells
    assert baseline.is_baseline and baseline.spec.sir is None and baseline.axes["loss"] == "sir"
    assert v4.spec.sir.variant == "v4" and v4.spec.training_data.negatives == 7 and v4.spec.training_data.size == 800
    assert kind_of(v4.spec).axes(v4.spec)["loss"] == v4.axes["loss"] == "sir@v4[4-2]"  # cell and trial runs: one label
    assert kind_of(v4.spec).key(v4.spec) != kind_of(baseline.spec).key(baseline.spec)


def test_v0_in_the_losses_and_grid_owned_training_data_are_refused():
    with pytest.raises(ValueError, match="sir v0 .* is the baseline cell"):
        _sweep(baseline_ranking="sir", losses=[{"ranking": "sir", "sir": {"variant": "v0"}}])
    with pytest.raises(ValueError, match="base.training_data.size is set by the grid"):
        SweepSpec.model_validate({"name": "s", "base": {"training_data": {"size": 100}},
                                  "grid": {"models": ["m"], "losses": [{"ranking": "pointwise"}],
                                           "augmentations": [{"method": "none"}], "sizes": [100]}})


def test_k_per_level_is_searched_among_schedules_of_the_cells_depth():

    sweep = _sweep(baseline_ranking="sir", losses=[{"ranking": "sir", "sir": {"variant": "v2", "levels": [4, 2]}},
                                                   {"ranking": "sir", "sir": {"variant": "v3", "levels": [6, 4, 2]}}])
    search = sweep.search.model_validate({"sir_levels": {"choices": [[4, 2], [6, 2], [6, 4, 2], [5, 3, 2]]}})
    baseline, two, three = expand_grid(sweep)
    seen = {len_: set() for len_ in (2, 3)}
    for cell in (two, three):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))  # one study per cell, as a sweep
        for _ in range(12):
            params = sample(study.ask(), cell, search)
            spec = kind_of(cell.spec).apply_params(cell.spec, params)
            seen[len(cell.spec.sir.levels)].add(tuple(spec.sir.levels))
            assert spec.sir.variant == cell.spec.sir.variant and spec.training_data == cell.spec.training_data
    assert seen == {2: {(4, 2), (6, 2)}, 3: {(6, 4, 2), (5, 3, 2)}}
    assert "sir_levels" not in sample(study.ask(), baseline, search)  # V0 has no levels
    with pytest.raises(ValueError, match="levels must shrink"):
        sweep.search.model_validate({"sir_levels": {"choices": [[4, 4]]}})


@pytest.mark.slow  # a real sweep: Ray Tune, Ray Train, MLflow (about two minutes)
def test_a_tiny_sir_grid_runs_v0_and_a_curriculum_to_the_end(tmp_path, tiny_model_dir, scifact_dir):

    config = {"name": "tiny-sir",
              "base": {"data": {"collection": "beir/scifact", "validation_queries": 5},
                       "first_stage": {"train_depth": 20, "validation_depth": 5, "test_depth": 3},
                       "training_data": {"negatives": 7},
                       "optimization": {"epochs": 1, "batching": "per_query", "batch_size": 16},
                       "resources": {"workers": 1, "cpus_per_worker": 1}},
              "grid": {"models": [str(tiny_model_dir)], "max_length": 64, "baseline_ranking": "sir",
                       "losses": [{"ranking": "sir", "sir": {"variant": "v3", "levels": [4, 2]}}],
                       "augmentations": [{"method": "none"}], "sizes": [32]},
              "search": {"trials_per_cell": 1, "pruner": "none", "learning_rate": {"choices": [1.0e-3]}}}
    path = tmp_path / "tiny-sir.yaml"
    path.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = run_cli(tmp_path, "sweep", str(path), "--json", "--storage", str(tmp_path / "store"), "--tracking-uri", uri,
                   timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = mlflow_runs(uri, "tiny-sir")
    cells = {r.data.tags["loss"]: r for r in by_kind(runs, "cell")}
    assert set(cells) == {"sir", "sir@v3[4-2]"} and all(r.info.status == "FINISHED" for r in cells.values())
    trials = {r.data.tags["loss"]: r for r in by_kind(runs, "trial")}
    assert trials["sir@v3[4-2]"].data.params["sir.variant"] == "v3" and trials["sir"].data.params["sir"] == "None"
    assert trials["sir@v3[4-2]"].data.params["sir.levels"] == "[4, 2]"
    for loss, run in cells.items():  # each winner tested on the test data, with the first stage beside it
        assert 0 <= run.data.metrics["test_ndcg_at_10"] <= 1 and "bm25_test_ndcg_at_10" in run.data.metrics, loss
    # V3's level losses add L_M to V0's L_1: a larger training loss from the same start
    assert trials["sir@v3[4-2]"].data.metrics["train_loss"] > trials["sir"].data.metrics["train_loss"]
