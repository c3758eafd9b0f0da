"""A finished sweep's uncertainty on its cell runs, as MLflow metrics the UI compares.

Once every cell is tested, each cell run of a system (a grid cell over its seeds) gets, per
evaluation target (``test`` and each zero-shot collection) and measure of
:data:`LOGGED_MEASURES`:

- ``<target>/<measure>_seed_mean``, ``_seed_std`` (several seeds only) and ``_seeds``: the
  system's mean over its seeds, their standard deviation and count;
- ``<target>/<measure>_difference``, ``_ci_low`` and ``_ci_high`` (not on baselines): the mean
  difference against the baseline (same model and size) and its paired bootstrap 95% interval,
  over queries x seeds.

MLflow keeps one value per run and metric, and the comparison of runs (a cell with each seed
its own run) shows these beside the cell's own ``test/ndcg_at_10``. The statistics are
:mod:`workloads.evaluation.statistics`', the same as the report's ``--ci`` (the report is not
imported: this reads the per-query values the cells stored).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.sweep.grid import SweepSpec
from workloads.core.logs import get_logger
from workloads.evaluation import PRIMARY_METRIC
from workloads.evaluation.statistics import compare_uncertainty, seed_summary

log = get_logger("sweep")

LOGGED_MEASURES = (PRIMARY_METRIC,)  # one measure: 6 numbers per target, not 6 per measure in every cell's charts
SYSTEM_AXES = ("model", "loss", "augmentation", "size")


def _per_query(tracker: Tracker, run, prefixes: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """prefix -> metric -> query -> value of one run (the prefixes it has)."""
    artifacts = tracker.run_artifacts(run)
    listed = {Path(a.path).name for a in artifacts.list_artifacts("per_query")}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for prefix in prefixes:
            name = f"{prefix.rstrip('_')}.json"
            if name in listed:
                out[prefix] = json.loads(Path(artifacts.download_artifacts(f"per_query/{name}", tmp)).read_text())["per_query"]
    return out


def cell_statistics(systems: dict[tuple, dict], prefixes: list[str], measures=LOGGED_MEASURES) -> dict[tuple, dict[str, float]]:
    """System key (SYSTEM_AXES values) -> its metrics (code names, ``test_ndcg_at_10_ci_low``).

    ``systems``: key -> {"baseline": bool, "seeds": {seed: {prefix: {metric: {query: value}}}}}.
    A system gets a target's numbers when every seed has it; a comparison when its baseline
    (same model and size) has it too."""
    def per_seed(system: dict, prefix: str, metric: str) -> dict[str, dict[str, float]] | None:
        values = {seed: by_prefix.get(prefix, {}).get(metric) for seed, by_prefix in system["seeds"].items()}
        return None if not values or any(v is None for v in values.values()) else values

    out: dict[tuple, dict[str, float]] = {}
    for key, system in systems.items():
        baseline = next((s for k, s in systems.items() if s["baseline"] and k[0] == key[0] and k[3] == key[3]), None)
        metrics: dict[str, float] = {}
        for prefix in prefixes:
            for metric in measures:
                mine = per_seed(system, prefix, metric)
                if mine is None:
                    continue
                summary = seed_summary(mine)
                name = f"{prefix}{metric}"
                metrics[f"{name}_seed_mean"] = summary.mean
                metrics[f"{name}_seeds"] = float(summary.count)
                if summary.std is not None:
                    metrics[f"{name}_seed_std"] = summary.std
                theirs = per_seed(baseline, prefix, metric) if baseline is not None and not system["baseline"] else None
                if theirs is not None:
                    uncertainty = compare_uncertainty(mine, theirs)
                    metrics[f"{name}_difference"] = uncertainty.difference
                    metrics[f"{name}_ci_low"] = uncertainty.interval.low
                    metrics[f"{name}_ci_high"] = uncertainty.interval.high
        out[key] = metrics
    return out


def log_cell_statistics(sweep: SweepSpec, tracker: Tracker, experiment_id: str) -> int:
    """Log every finished system's statistics on its cell runs; the number of runs logged to."""
    runs = tracker.client.search_runs([experiment_id], filter_string=f"tags.`{schema.KIND_TAG}` = '{schema.CELL}'",
                                      max_results=50_000)
    by_key = {r.data.tags.get(schema.TRIAL_KEY_TAG): r for r in runs}
    prefixes = [schema.target_prefix(schema.TEST)] + [schema.target_prefix(t.name) for t in sweep.zero_shot]
    systems: dict[tuple, dict] = {}
    members: dict[tuple, list[str]] = {}
    incomplete = set()
    for cell in sweep.cells:
        key = tuple(cell.axes.get(a, "") for a in SYSTEM_AXES)
        run = by_key.get(cell.key)
        if cell.spec is None or run is None or run.info.status != "FINISHED":
            incomplete.add(key)
            continue
        system = systems.setdefault(key, {"baseline": cell.is_baseline, "seeds": {}})
        system["seeds"][cell.axes.get("seed", "")] = _per_query(tracker, run, prefixes)
        members.setdefault(key, []).append(run.info.run_id)
    complete = {k: v for k, v in systems.items() if k not in incomplete}
    try:
        statistics = cell_statistics(complete, prefixes)
    except ValueError as exc:  # seeds scored on different queries: the results stay as they are, the report says why
        log.warning("%s: no seeds' statistics or intervals logged to the cell runs: %s", sweep.name, exc)
        return 0
    logged = 0
    for key, metrics in statistics.items():
        for run_id in members[key] if metrics else []:
            tracker.log_metrics(run_id, metrics)
            logged += 1
    log.info("%s: seeds' mean and spread, and intervals against the baselines, logged to %d cell runs", sweep.name, logged)
    return logged
