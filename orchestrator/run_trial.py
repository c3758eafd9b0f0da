"""``orchestrate run``: one trial end to end, tracked as one MLflow run.

prepare data (driver, cached) -> train as Ray Train workers -> pick the best epoch by
validation nDCG@10 -> re-rank test with it (Ray task) -> log everything from the driver.
A trial whose finished MLflow run exists is not recomputed: its results are read back.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.execution import VALIDATION_METRIC, evaluate_on_ray, init_ray, train_on_ray
from orchestrator.tracking import Tracker
from workloads.paths import stable_key
from workloads.retrieval.bm25 import write_trec_run
from workloads.spec import RerankingSpec, TrialSpec
from workloads.training import WEIGHT_METRIC
from workloads.trial import final_interpolation, prepare_trial


TEST_CROSS_ENCODER_PREFIX = "test_cross_encoder_"  # the cross-encoder alone, logged when interpolating


# LossSpec fields added after trials were first keyed, with the value that computes what
# trials computed before the field existed. Such a field is left out of the key when the
# chosen losses do not read it or when it has that value, so results tracked before it
# existed keep their identity (and are reused); any other value is a new experiment.
_LEGACY_LOSS_VALUES = {"scl_normalization": "per_anchor", "ctriplet_centroid": "inclusive", "tml_reduction": "all",
                       "nca_scale": 1.0}


def trial_key(spec: TrialSpec) -> str:
    """Identity of a trial's result: everything that changes it (its name and resources do not).

    A section or field at the value that reproduces earlier behaviour is left out when it
    was added after trials were first keyed (``reranking``, the loss readings of
    ``_LEGACY_LOSS_VALUES``, ``augmentation.redraw`` where it changes nothing), so results
    tracked before it existed keep their identity. Augmented trials also key the sentence
    splitter's version: a new splitter makes new training data.
    """
    from workloads.augmentation import SPLITTER_VERSION
    from workloads.losses import loss_parameters

    loss = spec.loss
    active = set(loss_parameters(loss))
    if loss.contrastive != "nca":  # nca_map's default was identity before NCA learned its map by default
        spec = spec.model_copy(update={"loss": loss.model_copy(update={"nca_map": "identity"})})
    exclude: dict = {"name": True, "resources": True}
    if spec.reranking == RerankingSpec():
        exclude["reranking"] = True
    exclude["loss"] = {f for f, legacy in _LEGACY_LOSS_VALUES.items() if f not in active or getattr(loss, f) == legacy}
    augmented = spec.augmentation.method != "none"
    if not augmented or spec.augmentation.redraw == "once" or spec.optimization.epochs == 1:
        exclude["augmentation"] = {"redraw"}  # one draw, as before per-epoch draws existed
    payload = spec.model_dump_json(exclude=exclude)
    return stable_key(payload, f"sentences-v{SPLITTER_VERSION}") if augmented else stable_key(payload)


@dataclass
class TrialReport:
    run_id: str
    reused: bool
    best_epoch: int
    metrics: dict[str, float]  # bm25_val_*, val_* (best epoch), bm25_test_*, test_*, timings


def _log(message: str) -> None:
    print(f"[run] {message}", file=sys.stderr, flush=True)


def run_trial(spec: TrialSpec, tracker: Tracker, storage_path: Path, ray_address: str | None = None,
              force: bool = False, experiment: str | None = None) -> TrialReport:
    key = trial_key(spec)
    experiment_id = tracker.experiment_id(experiment or spec.name)
    # The same trial (same resolved config, whatever its name) finished in any experiment of
    # this store is reused, not recomputed.
    finished = tracker.find_run(None, key, status="FINISHED")
    if finished is not None and not force:
        _log(f"trial {key} already finished in MLflow run {finished.info.run_id} "
             f"(experiment {finished.info.experiment_id}): reusing its results (--force reruns)")
        metrics = dict(finished.data.metrics)
        return TrialReport(finished.info.run_id, True, int(metrics.get("best_epoch", 0)), metrics)

    started = time.perf_counter()
    _log(f"preparing data for trial {spec.name} ({key})")
    prepared = prepare_trial(spec)
    prepare_seconds = time.perf_counter() - started

    run_id = tracker.start_trial_run(experiment_id, spec.name, key, spec.flat_params(), spec.axes())
    try:
        tracker.log_metrics(run_id, {f"bm25_val_{k}": v for k, v in prepared.first_stage_validation.items()})
        tracker.log_evaluation(run_id, "bm25_test_", prepared.first_stage_test)
        tracker.log_json(run_id, "", "data_stats.json", prepared.data_stats)
        tracker.log_json(run_id, "", "config.json", spec.model_dump(mode="json"))

        init_ray(ray_address)
        train_started = time.perf_counter()
        # Train V2 restores a run from storage by name: a crashed attempt resumes from its last
        # epoch checkpoint; --force starts a fresh run instead of restoring the finished one.
        run_name = f"{spec.name}-{key}" + (f"-{int(time.time())}" if force else "")
        epochs = train_on_ray(spec, prepared.training, storage_path, run_name)
        train_wall = time.perf_counter() - train_started
        for epoch in epochs:
            tracker.log_metrics(run_id, epoch.metrics, step=int(epoch.metrics["epoch"]))
        best = max(epochs, key=lambda e: e.metrics[VALIDATION_METRIC])
        best_epoch = int(best.metrics["epoch"])
        _log(f"best epoch {best_epoch} ({VALIDATION_METRIC} {best.metrics[VALIDATION_METRIC]:.4f}); testing {best.checkpoint}")

        test_started = time.perf_counter()
        tested = evaluate_on_ray(spec, prepared, best.checkpoint, final_interpolation(spec, best.metrics.get(WEIGHT_METRIC)))
        tracker.log_evaluation(run_id, "test_", tested.evaluation)
        if tested.weight is not None:
            tracker.log_evaluation(run_id, TEST_CROSS_ENCODER_PREFIX, tested.cross_encoder)
            tracker.log_metrics(run_id, {"interpolation_weight": tested.weight})
        with tempfile.TemporaryDirectory() as tmp:
            reranked = Path(tmp) / "test.reranked.trec"
            write_trec_run(tested.run, reranked, tag=f"rerank-lab.{spec.name}")
            tracker.log_file(run_id, reranked, "runs")
        tracker.log_file(run_id, Path(prepared.test_first_stage_run), "runs")

        seconds_per_epoch = sum(e.metrics["epoch_train_seconds"] for e in epochs) / len(epochs)
        timings = {
            "best_epoch": best_epoch,
            "time_prepare_seconds": prepare_seconds,
            "time_train_wall_seconds": train_wall,
            "time_train_seconds_per_epoch": seconds_per_epoch,
            "time_test_seconds": time.perf_counter() - test_started,
            "time_trial_seconds": time.perf_counter() - started,
        }
        tracker.log_metrics(run_id, timings)
        tracker.log_metrics(run_id, {f"best_{k}": v for k, v in best.metrics.items() if k.startswith("val_")})
        tracker.set_tags(run_id, {"best_checkpoint": best.checkpoint})
        tracker.finish(run_id, "FINISHED")
    except BaseException:
        tracker.finish(run_id, "FAILED")  # partial results are never reported as complete
        raise
    return TrialReport(run_id, False, best_epoch, tracker.run_metrics(run_id))
