"""A trial's identity in the run store, the identity of the data it read, and its reuse.

A trial is found again by its key (:func:`trial_key`): its kind's content key (``TrialKind.key``), or,
for a kind whose result is kept outside the run store and shared by every trial that reads it (a
selector, an EAR trial: ``TrialKind.keeps_result``), ``<kind>:<key>``. A finished run is reused
only for the same data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.tracking import Tracker
from workloads.core.paths import stable_key
from workloads.data.identity import collection_identity
from workloads.evaluation.ranking import TIE_ORDER
from workloads.kinds import kind_of

log = logging.getLogger(__name__)


def trial_key(spec) -> str:
    """A trial's identity in the run store (its run's ``TRIAL_KEY_TAG``): its kind's content key
    (``TrialKind.key``: everything that changes its result; its name and resources do not),
    ``<kind>:<key>`` for a kind that keeps its result (``TrialKind.keeps_result``)."""
    kind = kind_of(spec)
    return f"{kind.name}:{kind.key(spec)}" if kind.keeps_result else kind.key(spec)


def _first_stage_file(first_stage) -> str:
    if first_stage is None or first_stage.path is None:
        return ""
    path = Path(first_stage.path).expanduser()
    return stable_key(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else ""


def training_data_identity(spec) -> str:
    """The identity of the data a trial trains and validates on (its collection's files, a run
    file it reads, the order its rankings are cut and measured in), recorded on its run: a finished
    trial is reused only for the same data."""
    return stable_key(collection_identity(spec.data.collection), _first_stage_file(getattr(spec, "first_stage", None)),
                      TIE_ORDER)


def test_data_identity(evaluation_targets: Sequence) -> str:
    """The identity of the data of every target (collections and their first stages' files) and
    of the order its rankings are cut and measured in."""
    parts: list = [TIE_ORDER]
    for target in evaluation_targets:
        data = target.spec.data
        parts += [collection_identity(data.test_collection or data.collection), data.test_split,
                  _first_stage_file(getattr(data, "test_first_stage", None) or getattr(target.spec, "first_stage", None))]
    return stable_key(*parts)


def finished_run(tracker: Tracker, key: str, data: str, test_data: str):
    """The finished run of this trial on the same data, to reuse; a finished run on data that has
    changed since is marked stale (it stays) and None is returned."""
    finished = tracker.find_run(None, key, status="FINISHED")
    if finished is None:
        return None
    recorded = (finished.data.tags.get(schema.DATA_TAG, data), finished.data.tags.get(schema.TEST_DATA_TAG, test_data))
    if recorded == (data, test_data):
        log.info("trial %s already finished in MLflow run %s (experiment %s): reusing its results (--force reruns)",
                 key, finished.info.run_id, finished.info.experiment_id)
        return finished
    log.info("trial %s finished in MLflow run %s on data that has changed since: running it again (that run stays, "
             "marked stale)", key, finished.info.run_id)
    tracker.set_tags(finished.info.run_id, {schema.TRIAL_KEY_TAG: f"{key}@stale", schema.STALE_TAG: "true"})
    return None


def close_kept_run(tracker: Tracker, experiment_id: str, key: str, kept: Path, result_file: str) -> None:
    """A result kept, then the driver died before its run was closed: close it with the kept summary."""
    open_run = tracker.find_run(experiment_id, key)
    if open_run is not None and open_run.info.status != "FINISHED":
        summary = json.loads((kept / result_file).read_text())
        tracker.log_metrics(open_run.info.run_id, {k: v for k, v in summary.items() if isinstance(v, (int, float))})
        tracker.set_tags(open_run.info.run_id, {schema.CHECKPOINT_TAG: str(kept)})
        tracker.finish(open_run.info.run_id, "FINISHED")
