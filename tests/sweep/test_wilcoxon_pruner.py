"""The sweep's default pruner compares a trial with its cell's best trial query by query
(Optuna's WilcoxonPruner on each validation query's nDCG@10), fed as Tune feeds the searcher."""

import random

from orchestrator.sweep.grid import SweepSpec, expand_grid
from orchestrator.sweep.search import CellStudiesSearcher
from workloads.evaluation import SELECTION_PER_QUERY

SWEEP = {
    "name": "wilcoxon",
    "base": {"data": {"collection": "beir/scifact"}, "optimization": {"epochs": 3}},
    "grid": {"models": ["tiny"], "losses": [{"ranking": "pointwise", "contrastive": "scl"}],
             "augmentations": [{"method": "bm25", "k": 2}], "sizes": [100]},
    "search": {"trials_per_cell": 8},
}
QUERIES = 30
BEST = [round(random.Random(7).uniform(0.2, 0.9), 4) for _ in range(QUERIES)]  # the first trial's epoch 1


def _searcher(tmp_path, **search):
    sweep = SweepSpec.model_validate({**SWEEP, "search": {**SWEEP["search"], **search}})
    cells = [c for c in expand_grid(sweep) if c.spec is not None]
    searcher = CellStudiesSearcher(cells[:1], sweep.search, f"sqlite:///{tmp_path / 'optuna.db'}")
    searcher.storage = str(tmp_path / "ray")
    return searcher, searcher.studies[cells[0].key]


def _epoch(searcher, trial_id, epoch, per_query):
    """One epoch's result as the trial reports it; whether the trial has been asked to stop."""
    searcher.on_trial_result(trial_id, {"epoch": epoch, "val_ndcg_at_10": sum(per_query) / len(per_query),
                                        SELECTION_PER_QUERY: per_query})
    return trial_id in searcher.pruning


def _finish(searcher, trial_id, value):
    searcher.on_trial_result(trial_id, {"val_ndcg_at_10": value, "final": 1})
    searcher.on_trial_complete(trial_id, {"val_ndcg_at_10": value, "final": 1})


def test_the_default_pruner_stops_a_trial_worse_query_by_query_not_one_worse_on_average_by_few_queries(tmp_path):
    searcher, study = _searcher(tmp_path)
    assert searcher.search.pruner == "wilcoxon"
    searcher.suggest("a")
    # the first trial: no best trial to compare with
    assert [_epoch(searcher, "a", e, [min(1.0, v + 0.05 * (e - 1)) for v in BEST]) for e in (1, 2, 3)] == [False] * 3
    _finish(searcher, "a", sum(BEST) / QUERIES + 0.1)
    # the cell's study holds one value per epoch (what status and the sampler read); the
    # per-query values are beside it: step (epoch - 1) x queries + the query's place
    assert sorted(study.trials[0].intermediate_values) == [1, 2, 3]
    steps = searcher.query_by_query[study.study_name].study.trials[0].intermediate_values
    assert len(steps) == 3 * QUERIES and steps[QUERIES + 4] == min(1.0, BEST[4] + 0.05)

    searcher.suggest("worse")  # a little worse on every query: significant
    assert _epoch(searcher, "worse", 1, [v - 0.02 for v in BEST]) is True

    # worse on average than that one, but lost on 3 of the 30 queries only: kept
    searcher.suggest("few")
    few = [0.0 if i < 3 else v for i, v in enumerate(BEST)]
    assert sum(few) / QUERIES < sum(BEST) / QUERIES - 0.02
    assert _epoch(searcher, "few", 1, few) is False

    searcher.suggest("better")
    assert _epoch(searcher, "better", 1, [min(1.0, v + 0.01) for v in BEST]) is False

    # a trial whose kind reports no per-query values is never pruned by it, however low
    searcher.suggest("silent")
    searcher.on_trial_result("silent", {"epoch": 1, "val_ndcg_at_10": 0.0})
    assert "silent" not in searcher.pruning


def test_a_resumed_driver_compares_with_the_best_trial_an_earlier_one_kept(tmp_path):
    """The per-query values live in a file per trial beside the sweep's storage: a new driver
    (a new searcher on the same storage) restores the cell's best trial from them."""
    searcher, _ = _searcher(tmp_path)
    searcher.suggest("a")
    for epoch in (1, 2, 3):
        _epoch(searcher, "a", epoch, BEST)
    _finish(searcher, "a", sum(BEST) / QUERIES)
    resumed, study = _searcher(tmp_path)
    resumed.suggest("worse")
    assert _epoch(resumed, "worse", 1, [v - 0.02 for v in BEST]) is True
    # another pruner on resume reads the study's per-epoch values, as it always did
    median, _ = _searcher(tmp_path, pruner="median", pruner_startup_trials=1)
    median.suggest("low")
    assert _epoch(median, "low", 1, [v - 0.3 for v in BEST]) is True
