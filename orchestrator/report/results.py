"""Read a sweep's results back from MLflow for reports and comparisons.

Every number a report prints comes from the per-query values stored with a run
(``per_query/<prefix>.json``, written by :meth:`Tracker.log_evaluation`). When they are
loaded, the aggregate is recomputed from them and checked against the metric logged on the
run: a mismatch means the store is inconsistent and is an error, never a footnote.
"""

from __future__ import annotations

import ast
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.targets import collection_label, targets
from orchestrator.sweep.grid import Cell, SweepSpec
from orchestrator.sweep.status import STATUS_OK, cell_states
from workloads.core.errors import InputError
from workloads.evaluation import DISPLAY_NAMES, MEASURES, mean_of
from workloads.retrieval.first_stage import FIRST_STAGES

# How a cell that has no number is shown; never as 0.
STATUS_LABELS = {
    "unavailable": "n/a",     # no workload can run the cell yet (e.g. a supervised augmenter)
    "pending": "pending",     # no MLflow run yet
    "running": "running",     # search or winner evaluation not finished
    "failed": "failed",       # every trial failed, or the evaluation failed
    "interrupted": "interrupted",  # stopped by Ctrl-C: rerunning the sweep resumes it
    "stale": "stale",         # tested on data that has changed since: rerunning the sweep tests it again
    "missing": "missing",     # finished, but never evaluated on this collection / metric
}
AGGREGATE_TOLERANCE = 1e-9


def metric_key(name: str) -> str:
    """``ndcg@10``, ``nDCG@10`` or ``ndcg_at_10`` -> ``ndcg_at_10``; unknown names are input errors."""
    lowered = name.strip().lower()
    names = {key: key for key in MEASURES} | {display.lower(): key for key, display in DISPLAY_NAMES.items()}
    names |= {"mrr@10": "rr_at_10", "mrr@100": "rr_at_100", "map": "ap"}  # the field's other names
    if lowered in names:
        return names[lowered]
    raise InputError("--metric", f"unknown metric '{name}' (choose from {', '.join(DISPLAY_NAMES.values())})")


@dataclass(frozen=True)
class PerQuery:
    """One run's evaluation on one collection: metric -> query id -> value."""

    run_id: str
    prefix: str
    values: dict[str, dict[str, float]]
    relevance_level: int


class RunReader:
    """Loads per-query artifacts of MLflow runs, cross-checked against their logged aggregates."""

    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self._cache: dict[tuple[str, str], PerQuery | None] = {}
        self._artifacts: dict[str, object] = {}   # run id -> its artifact repository
        self._listed: dict[str, set[str]] = {}    # run id -> the names of its per-query files

    def per_query(self, run, prefix: str) -> PerQuery | None:
        """The run's per-query values under ``prefix`` (None when it has none)."""
        key = (run.info.run_id, prefix)
        if key not in self._cache:
            self._cache[key] = self._load(run, prefix)
        return self._cache[key]

    def _load(self, run, prefix: str) -> PerQuery | None:
        run_id = run.info.run_id
        name = f"{prefix.rstrip('_')}.json"
        if run_id not in self._artifacts:
            self._artifacts[run_id] = self.tracker.run_artifacts(run)
            self._listed[run_id] = {Path(a.path).name for a in self._artifacts[run_id].list_artifacts("per_query")}
        if name not in self._listed[run_id]:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            local = self._artifacts[run_id].download_artifacts(f"per_query/{name}", tmp)
            payload = json.loads(Path(local).read_text())
        per_query = PerQuery(run_id, prefix, payload["per_query"], int(payload.get("relevance_level", 1)))
        self._cross_check(run, per_query)
        return per_query

    @staticmethod
    def _cross_check(run, per_query: PerQuery) -> None:
        """Recompute every logged aggregate from the per-query values; disagreement is an error."""
        for metric, values in per_query.values.items():
            logged = run.data.metrics.get(f"{per_query.prefix}{metric}")
            if logged is None:
                continue
            recomputed = mean_of(values.values()) if values else 0.0
            if abs(recomputed - logged) > AGGREGATE_TOLERANCE:
                raise InputError(f"MLflow run {run.info.run_id}",
                                 f"{per_query.prefix}{metric} is logged as {logged:.6f} but its {len(values)} per-query "
                                 f"values average {recomputed:.6f}: the store is inconsistent")


@dataclass
class CellResult:
    """A grid cell and what MLflow holds for it."""

    cell: Cell
    status: str  # ok | one of STATUS_LABELS
    run: object | None = None  # the cell's MLflow run (mlflow.entities.Run)

    @property
    def axes(self) -> dict[str, str]:
        return self.cell.axes

    @property
    def is_baseline(self) -> bool:
        return self.cell.is_baseline


@dataclass
class SweepResults:
    sweep: SweepSpec
    experiment_id: str | None
    cells: list[CellResult]
    reader: RunReader

    @property
    def train_collection(self) -> str:
        return self.sweep.base.get("data", {}).get("collection", "")

    @property
    def test_collection(self) -> str:
        """The collection the winners' ``test_*`` numbers are measured on (``data.test_collection``
        when set, else the training collection)."""
        data = self.sweep.base.get("data", {})
        return data.get("test_collection") or data.get("collection", "")

    @property
    def test_split(self) -> str:
        return self.sweep.base.get("data", {}).get("test_split", "test")

    def evaluation_targets(self) -> list[tuple[str, str]]:
        """(label, metric prefix) of every collection the winners were tested on, test first.

        A label is the collection's short name (``scifact``), with ``:split`` when the split
        is not ``test``; ``--collection`` takes a label or the full reference.
        """
        targets = [(collection_label(self.test_collection, self.test_split), schema.target_prefix(schema.TEST))]
        return targets + [(collection_label(t.collection, t.split), schema.target_prefix(t.name)) for t in self.sweep.zero_shot]

    def first_stage_label(self, prefix: str) -> str:
        """The label of the first stage the winners re-ranked on ``prefix``'s collection (its
        method's, from the first-stage registry: ``BM25``, ``hybrid``, ``dense``, ...): a target's
        own first stage where it has one, else the trial's."""
        runnable = next((c.spec for c in self.sweep.cells if c.spec is not None), None)
        for target in targets(runnable, self.sweep.zero_shot_targets) if runnable is not None else []:
            if schema.target_prefix(target.name) == prefix:
                used = getattr(target.spec.data, "test_first_stage", None) or getattr(target.spec, "first_stage", None)
                if used is not None and getattr(used, "method", None) in FIRST_STAGES:
                    return FIRST_STAGES[used.method].label
        return FIRST_STAGES["bm25"].label  # (the default first stage)

    def prefix_for(self, collection: str | None) -> str:
        """The metric prefix of ``--collection`` (default: the sweep's own test split)."""
        if collection is None or collection == self.test_collection:
            return schema.target_prefix(schema.TEST)
        targets = self.evaluation_targets()
        for label, prefix in targets:
            if collection == label:
                return prefix
        for target in self.sweep.zero_shot:
            if collection == target.collection:
                return schema.target_prefix(target.name)
        names = ", ".join(label for label, _ in targets)
        raise InputError("--collection", f"sweep {self.sweep.name} was not evaluated on '{collection}' (it was on: {names})")

    def first_stage(self, prefix: str) -> dict[str, float] | None:
        """The first stage's per-query ``metric`` values on ``prefix``'s queries (the same for every
        cell of the sweep: read from the first finished cell that has them)."""
        first_stage_prefix = schema.first_stage_prefix(prefix.removesuffix("_"))
        for result in self.cells:
            if result.status == STATUS_OK:
                evaluation = self.reader.per_query(result.run, first_stage_prefix)
                if evaluation is not None:
                    return evaluation
        return None

    def per_query(self, result: CellResult, prefix: str, metric: str) -> dict[str, float] | None:
        if result.status != STATUS_OK:
            return None
        evaluation = self.reader.per_query(result.run, prefix)
        if evaluation is None or metric not in evaluation.values:
            return None
        return evaluation.values[metric]


def load_sweep_results(sweep: SweepSpec, tracker: Tracker) -> SweepResults:
    """Every cell of the grid with its MLflow cell run and status (no artifact is read yet)."""
    experiment_id, states = cell_states(sweep, tracker)
    return SweepResults(sweep, experiment_id, [CellResult(cell, status, run) for cell, status, run in states], RunReader(tracker))


def winners(results: SweepResults) -> list[dict[str, str]]:
    """Each tested cell's axes and winning hyper-parameters, under the names of the params its
    MLflow runs carry (:func:`schema.comparison_params`), with its validation objective and
    trial count. The values come from the cell's winner tag: MLflow keeps a param's first value,
    the tag follows a winner that changed when more trials ran."""
    rows = []
    for result in results.cells:
        if result.status != STATUS_OK:
            continue
        chosen = ast.literal_eval(result.run.data.tags.get(schema.WINNER_PARAMS_TAG, "{}"))
        metrics = result.run.data.metrics
        row = schema.comparison_params(result.axes, chosen)
        row[schema.BEST_OBJECTIVE] = f"{metrics[schema.BEST_OBJECTIVE]:.4f}" if schema.BEST_OBJECTIVE in metrics else "-"
        row[schema.TRIALS_COMPLETE] = str(int(metrics.get(schema.TRIALS_COMPLETE, 0)))
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- systems

SYSTEM_AXES = ("model", "loss", "augmentation", "size")
# Which status a system of several seeds shows when its seeds disagree: the least finished.
_STATUS_ORDER = ("failed", "stale", "interrupted", "running", "pending", "missing", "unavailable", STATUS_OK)


@dataclass
class SystemResult:
    """A cell over all its seeds: per-query values averaged across seeds (one value per query)."""

    axes: dict[str, str]  # SYSTEM_AXES
    is_baseline: bool
    status: str
    per_query: dict[str, float] | None
    validation: float | None  # mean over seeds of the winners' validation nDCG@10
    cells: list[CellResult]
    per_seed: dict[str, dict[str, float]] | None = None  # seed -> query -> value (when status is ok)

    @property
    def value(self) -> float | None:
        if self.per_query is None:
            return None
        return mean_of(self.per_query.values()) if self.per_query else 0.0

    @property
    def label(self) -> str:
        return "/".join(self.axes[a] for a in SYSTEM_AXES)


def systems(results: SweepResults, metric: str, prefix: str) -> list[SystemResult]:
    """Every system of the grid (grid order) with its per-query ``metric`` on ``prefix``'s collection."""
    groups: dict[tuple, list[CellResult]] = {}
    for result in results.cells:
        groups.setdefault(tuple(result.axes[a] for a in SYSTEM_AXES), []).append(result)
    out = []
    for key, members in groups.items():
        per_seed = [results.per_query(m, prefix, metric) for m in members]
        statuses = [m.status if m.status != STATUS_OK or pq is not None else "missing" for m, pq in zip(members, per_seed)]
        status = min(statuses, key=_STATUS_ORDER.index)
        per_query = by_seed = None
        if status == STATUS_OK:
            qids = set(per_seed[0])
            if any(set(pq) != qids for pq in per_seed):
                raise InputError(f"sweep {results.sweep.name}", f"the seeds of {'/'.join(key)} were scored on different queries")
            per_query = {q: mean_of(pq[q] for pq in per_seed) for q in sorted(qids)}
            by_seed = {m.axes.get("seed", str(i)): pq for i, (m, pq) in enumerate(zip(members, per_seed))}
        validations = [m.run.data.metrics.get(schema.BEST_OBJECTIVE) for m in members if m.run is not None]
        validation = mean_of(validations) if validations and None not in validations else None
        out.append(SystemResult(dict(zip(SYSTEM_AXES, key)), members[0].is_baseline, status, per_query, validation, members,
                                by_seed))
    return out


def baseline_of(system: SystemResult, all_systems: list[SystemResult]) -> SystemResult | None:
    """The baseline a system is compared with: same model and size, no augmentation, plain ranking loss."""
    return next((s for s in all_systems if s.is_baseline and s.axes["model"] == system.axes["model"]
                 and s.axes["size"] == system.axes["size"]), None)
