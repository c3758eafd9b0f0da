"""The one trial lifecycle on Ray, tracked in the run store: :func:`run_trial` for every kind.

:func:`workloads.kinds.run_steps` walks the steps in the one order (requirements -> prepare
-> train -> choose the epoch -> test every target -> keep -> log); :class:`RayTrialSteps`
carries each out here: required trials first (each its own :func:`run_trial`), the data
prepared on the driver (cached by content), training as Ray Train workers, every target
tested as a Ray task, the result kept where the kind keeps one (a selector, an EAR trial),
everything logged from the driver under :mod:`orchestrator.core.schema`'s names.
``orchestrate run``, a required trial (:func:`ensure_requirement`) and the in-process runner
(``workloads.kinds.run_in_process``) and a sweep's Tune trial
(``orchestrator.sweep.tune.TuneTrialSteps``) walk the same steps; :func:`training_summary` is
what a trial's training leaves (the same names for every command), and a sweep's winners are
tested, kept and logged with :mod:`~orchestrator.lifecycle.targets` and :func:`keep_result`. A trial's outcome is read back
typed (:class:`TrialResult`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.execution import EpochResult, check_resources, init_ray, submit_task, train_on_ray
from orchestrator.core.tracking import Tracker
from orchestrator.lifecycle.identity import (
    close_kept_run,
    finished_run,
    test_data_identity,
    training_data_identity,
    trial_key,
)
from orchestrator.lifecycle.targets import TargetResult, log_target, submit_evaluations, targets
from workloads.evaluation.reranking import Reranking
from workloads.kinds import TrialKind, choose_epoch, kind_of, requirements, result_summary, run_steps

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- a trial's outcome, typed

@dataclass
class Ranking:
    """One ranking's measures on one set of queries (``model`` is the final ranking)."""

    model: dict[str, float]
    first_stage: dict[str, float]
    cross_encoder: dict[str, float] = field(default_factory=dict)  # when the final ranking is fused
    weight: float | None = None


@dataclass
class TrialResult:
    """A trial's outcome: its run (empty for a kept result reused without one), whether it was
    reused, the chosen epoch, its validation and test rankings, its timings, and where its
    kind kept its result (None for a kind that keeps none)."""

    run_id: str
    reused: bool
    best_epoch: int
    validation: Ranking
    tests: dict[str, Ranking]  # target name -> its rankings
    timings: dict[str, float]
    kept: Path | None = None

    @classmethod
    def from_metrics(cls, run_id: str, reused: bool, metrics: dict[str, float], target_names: Sequence[str],
                     kept: Path | None = None) -> TrialResult:
        validation = Ranking(schema.measures(metrics, f"{schema.BEST_PREFIX}{schema.VALIDATION_PREFIX}"),
                             schema.measures(metrics, schema.first_stage_prefix("val")),
                             schema.measures(metrics, f"{schema.BEST_PREFIX}{schema.VALIDATION_CROSS_ENCODER_PREFIX}"),
                             metrics.get(f"{schema.BEST_PREFIX}{schema.TUNED_WEIGHT}"))
        tests = {}
        for name in target_names:
            # runs tracked before one vocabulary logged the test weight unprefixed
            weight = metrics.get(schema.weight_metric(name), metrics.get("interpolation_weight") if name == schema.TEST else None)
            tests[name] = Ranking(schema.measures(metrics, schema.target_prefix(name)),
                                  schema.measures(metrics, schema.first_stage_prefix(name)),
                                  schema.measures(metrics, schema.cross_encoder_prefix(name)), weight)
        timings = {k: v for k, v in metrics.items() if k.startswith("time_")}
        return cls(run_id, reused, int(metrics.get(schema.BEST_EPOCH, 0)), validation, tests, timings, kept)


# ----------------------------------------------------------------------------- what its training leaves

# the epoch metrics (reported by the loop, once per attempt or per epoch) that break the overhead down
OVERHEAD_PARTS = {schema.TIME_STARTUP: "epoch_startup_seconds", schema.TIME_SETUP: "epoch_setup_seconds",
                  schema.TIME_CHECKPOINT: "epoch_checkpoint_seconds"}
# what a trial run holds about its training besides best_*: training_summary and timing
SUMMARY_METRICS = frozenset({schema.BEST_EPOCH, schema.TIME_TRAINING, schema.TIME_PER_EPOCH, schema.TIME_TRAIN_WALL,
                             schema.TIME_OVERHEAD, *OVERHEAD_PARTS})


def training_summary(epoch_metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """What a trial run holds about its training once it ended: the chosen epoch, its ``val_*``
    as ``best_val_*``, and the time spent in the loop. The same names for every command."""
    best = epoch_metrics[choose_epoch(epoch_metrics)]
    training = sum(m["epoch_train_seconds"] + m.get("epoch_validation_seconds", 0.0) for m in epoch_metrics)
    return {
        schema.BEST_EPOCH: best["epoch"],
        **{f"{schema.BEST_PREFIX}{k}": v for k, v in best.items() if k.startswith(schema.VALIDATION_PREFIX)},
        schema.TIME_TRAINING: training,
        schema.TIME_PER_EPOCH: sum(m["epoch_train_seconds"] for m in epoch_metrics) / len(epoch_metrics),
        **{name: sum(m.get(part, 0.0) for m in epoch_metrics) for name, part in OVERHEAD_PARTS.items()},
    }


def log_training(tracker: Tracker, run_id: str, epochs: Sequence[EpochResult]) -> dict[str, float]:
    """Log every epoch's metrics (step = epoch) on ``run_id``; returns the training summary."""
    for epoch in epochs:
        tracker.log_metrics(run_id, {k: v for k, v in epoch.metrics.items() if schema.is_epoch_metric(k)},
                            step=int(epoch.metrics["epoch"]))
    return training_summary([e.metrics for e in epochs])


def timing(train_wall: float, summary: dict[str, float]) -> dict[str, float]:
    """Ray Train's wall time and the overhead over the loop's own time."""
    return {schema.TIME_TRAIN_WALL: train_wall, schema.TIME_OVERHEAD: train_wall - summary[schema.TIME_TRAINING]}


# ----------------------------------------------------------------------------- the lifecycle on Ray

def run_trial(spec, tracker: Tracker, storage_path: Path, ray_address: str | None = None, force: bool = False,
              experiment: str | None = None, experiment_id: str | None = None, tags: dict[str, str] | None = None,
              interrupted=None) -> TrialResult:
    """One trial of any kind end to end as one run in the store (of ``experiment``, or
    ``experiment_id``). A kind that keeps its result outside the store (``TrialKind.finished``)
    reuses the kept one; any other reuses the same trial (same resolved config, whatever its
    name) finished in any experiment of this store on the same data (``force`` reruns): a
    finished run on data that has changed since keeps its results under a stale identity, and
    the trial runs again. ``tags``: more tags on its run (a sweep's parent run). ``interrupted``:
    a flag (``is_set()``) that says an error came from the command being stopped (a sweep
    trains its requirements in threads, which Ctrl-C does not reach): the run is then KILLED,
    not FAILED."""
    return run_steps(spec, RayTrialSteps(spec, tracker, storage_path, ray_address, force, experiment, experiment_id,
                                         tags or {}, interrupted))


def ensure_requirement(required, tracker: Tracker, experiment_id: str, storage_path: Path, ray_address: str | None = None,
                       tags: dict[str, str] | None = None, interrupted=None) -> Path:
    """A required trial's kept result (a trained selector, an EAR trial): the one kept already (by
    any earlier command), else trained now by :func:`run_trial` and tracked as one run of the
    kind's name. A crashed attempt resumes from its last epoch (its Ray Train run name is the
    content key) in the same run."""
    return run_trial(required, tracker, storage_path, ray_address, experiment_id=experiment_id, tags=tags,
                     interrupted=interrupted).kept


def keep_result(kind: TrialKind, spec, checkpoint: str, chosen: dict[str, float], tested: Reranking,
                recorded: dict[str, float]) -> Path | None:
    """Keep a trial's result where its kind keeps one (a selector installed in the cache, an
    EAR trial's reranker and run), as a Ray task with the trial's resources (keeping an EAR
    trial scores every query's expansions once more); None for a kind that keeps none (a
    re-ranking trial's checkpoint stays in the run store). ``tested``: its test ranking on its
    own test data; ``recorded``: what its run recorded besides (the training summary, times)."""
    import ray

    if not kind.keeps_result:
        return None
    summary = {**result_summary(chosen, tested), **recorded}
    return ray.get(submit_task(spec, kind.keep, spec, Path(checkpoint), summary))


class RayTrialSteps:
    """Each step of :func:`workloads.kinds.run_steps` on Ray, logged in the run store."""

    def __init__(self, spec, tracker: Tracker, storage_path: Path, ray_address: str | None, force: bool,
                 experiment: str | None, experiment_id: str | None, tags: dict[str, str], interrupted) -> None:
        self.tracker, self.storage_path, self.ray_address, self.force = tracker, storage_path, ray_address, force
        self.experiment, self._experiment_id, self.tags, self.interrupted = experiment or spec.name, experiment_id, tags, interrupted
        self.key = trial_key(spec)
        self.targets = targets(spec)
        self.run_id: str | None = None
        self.started = time.perf_counter()
        self.times: dict[str, float] = {}

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self.tracker.experiment_id(self.experiment)
        return self._experiment_id

    # --------------------------------------------------------------- requirements, reuse

    def reused(self, kind: TrialKind, spec) -> TrialResult | None:
        names = [t.name for t in self.targets]
        kept = kind.finished(spec)
        if kept is not None:
            close_kept_run(self.tracker, self.experiment_id(), self.key, kept, kind.result_file)
            log.info("%s %s already trained: reusing %s", kind.name, spec.name, kept)
            # what is printed is the run that produced it (its chosen epoch, its tests), not an empty result
            run = self.tracker.find_run(self.experiment_id(), self.key, status="FINISHED")
            if run is not None:
                return TrialResult.from_metrics(run.info.run_id, True, dict(run.data.metrics), names, kept)
            summary = json.loads((kept / kind.result_file).read_text())  # kept where this store has no run of it
            return TrialResult.from_metrics("", True, {k: v for k, v in summary.items() if isinstance(v, (int, float))},
                                            names, kept)
        if kind.keeps_result:  # its result is found where it is kept, never in the store
            return None
        self.data, self.test_data = training_data_identity(spec), test_data_identity(self.targets)
        finished = None if self.force else finished_run(self.tracker, self.key, self.data, self.test_data)
        if finished is None:
            return None
        return TrialResult.from_metrics(finished.info.run_id, True, dict(finished.data.metrics), names)

    def require(self, kind: TrialKind, spec, required: list) -> None:
        """Every required trial (a supervised augmentation's selector, an EAR first stage), kept
        once and tracked, before the trial's own data is prepared."""
        self.started = time.perf_counter()
        log.info("preparing data for %s %s (%s)", kind.title, spec.name, self.key)
        required = requirements([spec])
        for each in required:
            kind_of(each).prepare(each)  # their data is known good before the store is written
        if not required:
            return
        init_ray(self.ray_address)
        for each in [spec, *required]:  # a worker no node can hold is refused before anything waits forever
            check_resources(each)
        for each in required:
            ensure_requirement(each, self.tracker, self.experiment_id(), self.storage_path, self.ray_address)

    # --------------------------------------------------------------- prepare, train

    def prepare(self, kind: TrialKind, spec):
        prepared = kind.prepare(spec)
        for target in self.targets[1:]:  # every target's data before training: a bad one stops the trial now
            kind.prepare(target.spec)
        self.times[schema.TIME_PREPARE] = time.perf_counter() - self.started
        init_ray(self.ray_address)
        check_resources(spec)  # a worker no node can hold would wait forever: refused before the trial's run is written
        return prepared

    def _start_run(self, kind: TrialKind, spec, prepared) -> None:
        if kind.keeps_result:  # tagged as the trials that read it are: its data is part of its key
            tags = kind.requirement_tags(spec)
        else:
            tags = {**kind.axes(spec), schema.DATA_TAG: self.data, schema.TEST_DATA_TAG: self.test_data}
        self.run_id = self.tracker.start_trial_run(self.experiment_id(), spec.name, self.key, schema.flat_params(spec),
                                                   {**tags, **self.tags}, kind=kind.run_kind)
        self.tracker.log_metrics(self.run_id, prepared.first_stage_validation, prefix=schema.first_stage_prefix("val"))
        self.tracker.log_json(self.run_id, "", "data_stats.json", prepared.data_stats)
        self.tracker.log_json(self.run_id, "", "config.json", spec.model_dump(mode="json"))

    def train(self, kind: TrialKind, spec, prepared) -> list[EpochResult]:
        self._start_run(kind, spec, prepared)  # written only once the inputs are known good
        # Train V2 restores a run from storage by name: a crashed attempt resumes from its last
        # epoch checkpoint. A shared result's name is its content key; a trial's holds its data's
        # identity, so a run on changed data starts afresh, and --force starts a fresh run instead
        # of restoring the finished one.
        if kind.keeps_result:
            run_name = f"{kind.name}-{kind.key(spec)}"
        else:
            run_name = f"{spec.name}-{self.key}-{self.data[:8]}" + (f"-{int(time.time())}" if self.force else "")
        log.info("training the %s %s (%s)", kind.title, spec.name, self.key)
        train_started = time.perf_counter()
        epochs = train_on_ray(spec, kind.worker_inputs(prepared), self.storage_path, run_name)
        self.train_wall = time.perf_counter() - train_started
        self.summary = log_training(self.tracker, self.run_id, epochs)
        self.epochs = epochs
        return epochs

    # --------------------------------------------------------------- test, keep, log

    def test(self, kind: TrialKind, spec, prepared, chosen: EpochResult) -> list[TargetResult]:
        log.info("chosen epoch %d (%s %.4f); testing %s", int(chosen.metrics["epoch"]), schema.OBJECTIVE,
                 chosen.metrics[schema.OBJECTIVE], chosen.checkpoint)
        test_started = time.perf_counter()
        tested = []
        for pending in submit_evaluations(spec, self.targets, chosen.checkpoint, chosen.metrics, prepared):
            tested.append(pending.result())
            log_target(self.tracker, self.run_id, tested[-1], run_tag=f"rerank-lab.{spec.name}")
        now = time.perf_counter()
        self.metrics = {**self.summary, **timing(self.train_wall, self.summary), **self.times,
                        schema.TIME_EVALUATION: now - test_started, schema.TIME_TRIAL: now - self.started}
        if kind.keeps_result:  # early stopping: how many epochs ran
            self.metrics[schema.EPOCHS_RUN] = float(len(self.epochs))
        return tested

    def keep(self, kind: TrialKind, spec, chosen: EpochResult, tested: list[TargetResult]) -> Path | None:
        self.tracker.log_metrics(self.run_id, self.metrics)
        return keep_result(kind, spec, chosen.checkpoint, chosen.metrics, tested[0].reranking, self.metrics)

    def log(self, kind: TrialKind, spec, epochs, chosen: EpochResult, tested: list[TargetResult], kept: Path | None):
        self.tracker.set_tags(self.run_id, {schema.CHECKPOINT_TAG: str(kept) if kept is not None else chosen.checkpoint})
        self.tracker.finish(self.run_id, "FINISHED")
        log.info("%s %s: chosen epoch %d of %d, val nDCG@10 %.4f, test nDCG@10 %.4f", kind.title, spec.name,
                 int(chosen.metrics["epoch"]), len(epochs), chosen.metrics[schema.OBJECTIVE],
                 tested[0].reranking.evaluation.aggregate["ndcg_at_10"])
        return TrialResult.from_metrics(self.run_id, False, self.tracker.run_metrics(self.run_id),
                                        [t.name for t in self.targets], kept)

    def stopped(self, error: BaseException) -> None:
        """A step raised: its run (once started) is never reported as complete. Stopped by the
        user (Ctrl-C, or the sweep it runs in): KILLED and tagged interrupted, resumed from its
        last epoch by the next run; otherwise FAILED."""
        if self.run_id is None:
            return
        if isinstance(error, KeyboardInterrupt) or (self.interrupted is not None and self.interrupted.is_set()):
            self.tracker.set_tags(self.run_id, {schema.INTERRUPTED_TAG: "true"})
            self.tracker.finish(self.run_id, "KILLED")
        else:
            self.tracker.fail(self.run_id, "error", error)
