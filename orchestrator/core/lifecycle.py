"""The one trial lifecycle, for ``orchestrate run`` and ``orchestrate sweep`` alike.

prepare the data (driver, cached by content) -> train as Ray Train workers -> choose the
epoch on validation (``workloads.trial.choose_epoch``) -> evaluate the chosen checkpoint on
every target (Ray tasks) -> log, from the driver, under :mod:`orchestrator.core.schema`'s names.

``run`` walks these steps for one trial and logs everything on its trial run. A sweep runs
the training steps inside Ray Tune (one Tune trial per Optuna suggestion, logged on a trial
run by the same :func:`training_summary`) and evaluates each cell's winner on the cell run
with the same :func:`submit_evaluations` and :func:`log_target`. An evaluation target is a
trial spec whose test data is the target: the trial's own test data first, then each
perturbed copy of its test queries, then each zero-shot collection.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import schema
from orchestrator.core.execution import EpochResult, check_resources, init_ray, submit_evaluation, train_on_ray
from orchestrator.core.tracking import Tracker
from workloads.errors import InputError
from workloads.evaluation import Evaluation
from workloads.reranking import Reranking
from workloads.retrieval.bm25 import write_trec_run
from workloads.spec import TrialSpec
from workloads.trial import PreparedTrial, choose_epoch, final_interpolation, prepare_trial

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """Where a chosen checkpoint is tested: ``name`` prefixes its metrics, ``label`` names its
    collection for people (``scifact``, ``nfcorpus:dev``), ``spec``'s test data is the target."""

    name: str
    label: str
    spec: TrialSpec


def collection_label(collection: str, split: str) -> str:
    return collection.rstrip("/").rsplit("/", 1)[-1] + ("" if split == "test" else f":{split}")


def targets(spec: TrialSpec, zero_shot: Sequence[tuple] = ()) -> list[Target]:
    """The trial's own test data (``data.test_collection`` or its collection, ``test_split``),
    its perturbed copies (``robustness``), then each zero-shot (collection, split[, first
    stage]): a target with its own first stage (a sweep's ``zero_shot[].first_stage``)
    re-ranks that one's candidates."""
    own = spec.data.test_collection or spec.data.collection
    label = collection_label(own, spec.data.test_split)
    out = [Target(schema.TEST, label, spec)]
    if not isinstance(spec, TrialSpec):  # a kind that tests itself on its own split (an EAR trial)
        if zero_shot:
            raise ValueError(f"a {type(spec).__name__} has no zero-shot targets")
        return out
    for perturbation in spec.robustness:
        data = spec.data.model_copy(update={"test_perturbation": perturbation})
        out.append(Target(schema.perturbed_target(perturbation), f"{label}+{perturbation}",
                          spec.model_copy(update={"data": data})))
    for collection, split, *first_stage in zero_shot:  # (collection, split[, its own first stage])
        data = spec.data.model_copy(update={"test_collection": collection, "test_split": split})
        if first_stage and first_stage[0] is not None:
            data = data.model_copy(update={"test_first_stage": first_stage[0]})
        out.append(Target(schema.zero_shot_target(collection, split), collection_label(collection, split),
                          spec.model_copy(update={"data": data})))
    return out


def target_overlap(spec: TrialSpec, target: Target, query_ids: bool = True) -> str | None:
    """Why testing ``spec``'s trained model on ``target`` would report seen queries, or None.

    By configuration first (the target is the training or validation split of the training
    collection), then, with ``query_ids``, by the queries themselves where both collections
    are local files (only their queries and judgements are read; nothing is prepared). An
    ir_datasets collection is checked by configuration here and by its queries when the
    trial prepares it (before anything is trained)."""
    from workloads.data.collections import local_directory, resolve_collection, same_collection

    data, tested = spec.data, target.spec.data
    test_collection = tested.test_collection or tested.collection
    if not same_collection(data.collection, test_collection):
        return None
    split = tested.test_split
    if split == data.train_split:
        return f"target {target.label} is the training split '{split}' of {data.collection}"
    if data.validation_split is not None and split == data.validation_split:
        return f"target {target.label} is the validation split '{split}' of {data.collection}: the model is chosen on it"
    if not query_ids or local_directory(data.collection) is None:
        return None
    collection = resolve_collection(data.collection)
    tested_ids = set(collection.split_qrels(split))
    for role, seen in (("training", data.train_split), ("validation", data.validation_split)):
        if seen is None:
            continue
        shared = sorted(tested_ids & set(collection.split_qrels(seen)))
        if shared:
            return (f"target {target.label} shares {len(shared)} queries with the {role} split '{seen}' of "
                    f"{data.collection} (e.g. '{shared[0]}')")
    return None


def _first_stage_file(first_stage) -> str:
    from workloads.paths import stable_key

    if first_stage is None or first_stage.path is None:
        return ""
    path = Path(first_stage.path).expanduser()
    return stable_key(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) if path.is_file() else ""


def training_data_identity(spec: TrialSpec) -> str:
    """The identity of the data a trial trains and validates on (its collection's files, a run
    file it reads), recorded on its run: a finished trial is reused only for the same data."""
    from workloads.data.collections import collection_identity
    from workloads.paths import stable_key

    return stable_key(collection_identity(spec.data.collection), _first_stage_file(getattr(spec, "first_stage", None)))


def test_data_identity(evaluation_targets: Sequence[Target]) -> str:
    """The identity of the data of every target (collections and their first stages' files)."""
    from workloads.data.collections import collection_identity
    from workloads.paths import stable_key

    parts = []
    for target in evaluation_targets:
        data = target.spec.data
        parts += [collection_identity(data.test_collection or data.collection), data.test_split,
                  _first_stage_file(getattr(data, "test_first_stage", None) or getattr(target.spec, "first_stage", None))]
    return stable_key(*parts)


# ----------------------------------------------------------------------------- training


def chosen(epochs: Sequence[EpochResult]) -> EpochResult:
    """The epoch every command tests (see ``workloads.trial.choose_epoch``)."""
    return epochs[choose_epoch([e.metrics for e in epochs])]


# the epoch metrics (reported by the loop, once per attempt or per epoch) that break the overhead down
OVERHEAD_PARTS = {schema.TIME_STARTUP: "epoch_startup_seconds", schema.TIME_SETUP: "epoch_setup_seconds",
                  schema.TIME_CHECKPOINT: "epoch_checkpoint_seconds"}
# what a trial run holds about its training besides best_*: training_summary and timing
SUMMARY_METRICS = frozenset({schema.BEST_EPOCH, schema.TIME_TRAINING, schema.TIME_PER_EPOCH, schema.TIME_TRAIN_WALL,
                             schema.TIME_OVERHEAD, *OVERHEAD_PARTS})


def training_summary(epoch_metrics: Sequence[dict[str, float]]) -> dict[str, float]:
    """What a trial run holds about its training once it ended: the chosen epoch, its ``val_*``
    as ``best_val_*``, and the time spent in the loop. The same names for both commands."""
    best = epoch_metrics[choose_epoch(epoch_metrics)]
    training = sum(m["epoch_train_seconds"] + m.get("epoch_validation_seconds", 0.0) for m in epoch_metrics)
    return {
        schema.BEST_EPOCH: best["epoch"],
        **{f"{schema.BEST_PREFIX}{k}": v for k, v in best.items() if k.startswith(schema.VALIDATION_PREFIX)},
        schema.TIME_TRAINING: training,
        schema.TIME_PER_EPOCH: sum(m["epoch_train_seconds"] for m in epoch_metrics) / len(epoch_metrics),
        **{name: sum(m.get(part, 0.0) for m in epoch_metrics) for name, part in OVERHEAD_PARTS.items()},
    }


def log_training(tracker: Tracker, run_id: str, epochs: Sequence[EpochResult]) -> tuple[dict[str, float], EpochResult]:
    """Log every epoch's metrics (step = epoch) on ``run_id``; returns the training summary
    and the chosen epoch."""
    for epoch in epochs:
        tracker.log_metrics(run_id, {k: v for k, v in epoch.metrics.items() if schema.is_epoch_metric(k)},
                            step=int(epoch.metrics["epoch"]))
    return training_summary([e.metrics for e in epochs]), chosen(epochs)


def timing(train_wall: float, summary: dict[str, float]) -> dict[str, float]:
    """Ray Train's wall time and the overhead over the loop's own time."""
    return {schema.TIME_TRAIN_WALL: train_wall, schema.TIME_OVERHEAD: train_wall - summary[schema.TIME_TRAINING]}


# ----------------------------------------------------------------------------- evaluation


@dataclass
class TargetResult:
    target: Target
    reranking: Reranking      # the final ranking (and the cross-encoder alone when fused)
    first_stage: Evaluation   # BM25 on the same queries
    first_stage_run: str      # its TREC run file
    candidates: str = ""      # the candidates file that was re-ranked (its query texts are logged)


@dataclass
class PendingEvaluation:
    target: Target
    prepared: PreparedTrial
    ref: object  # Ray ObjectRef of a workloads.reranking.Reranking

    def result(self) -> TargetResult:
        import ray

        return TargetResult(self.target, ray.get(self.ref), self.prepared.first_stage_test, self.prepared.test_first_stage_run,
                            getattr(self.prepared, "test_candidates", ""))


def submit_evaluations(spec, evaluation_targets: Sequence[Target], checkpoint: str, tuned_weight: float | None,
                       chosen: dict[str, float] | None = None, prepared=None) -> list[PendingEvaluation]:
    """Start testing ``checkpoint`` on every target as Ray tasks (all in flight at once). A
    trial of another kind than re-ranking (a selector, an EAR trial: BM25 with the expansions
    it chooses) is tested by its kind's own test on its own split, ``chosen`` being its chosen
    epoch's metrics, ``prepared`` its prepared data when the caller holds it."""
    if not isinstance(spec, TrialSpec):
        from orchestrator.core.execution import submit_task
        from workloads.kinds import kind_of

        kind = kind_of(spec)
        prepared = prepared if prepared is not None else kind.prepare(spec)  # cached by content
        return [PendingEvaluation(target, prepared, submit_task(spec, kind.test, Path(checkpoint), prepared, spec,
                                                                chosen or {})) for target in evaluation_targets]
    interpolation = final_interpolation(spec, tuned_weight)
    pending = []
    for target in evaluation_targets:
        prepared = prepare_trial(target.spec)  # cached by content: only a new target computes anything
        pending.append(PendingEvaluation(target, prepared, submit_evaluation(target.spec, prepared, checkpoint, interpolation)))
    return pending


def log_target(tracker: Tracker, run_id: str, result: TargetResult, run_tag: str) -> None:
    """One target, logged the same way wherever it runs: the final ranking, the cross-encoder
    alone when fused, BM25, each with per-query values; the weight; both TREC runs."""
    name = result.target.name
    tracker.log_evaluation(run_id, schema.target_prefix(name), result.reranking.evaluation)
    if result.reranking.weight is not None:
        tracker.log_evaluation(run_id, schema.cross_encoder_prefix(name), result.reranking.cross_encoder)
        tracker.log_metrics(run_id, {schema.weight_metric(name): result.reranking.weight})
    tracker.log_evaluation(run_id, schema.first_stage_prefix(name), result.first_stage)
    with tempfile.TemporaryDirectory() as tmp:
        if result.candidates:  # the query texts the model was tested on (perturbed ones for robust_* targets)
            import pyarrow.parquet as pq

            table = pq.read_table(result.candidates, columns=["query_id", "query"]).to_pydict()
            texts = dict(zip(table["query_id"], table["query"]))
            queries = Path(tmp) / f"{name}.tsv"
            queries.write_text("".join(f"{qid}\t{text}\n" for qid, text in sorted(texts.items())), encoding="utf-8")
            tracker.log_file(run_id, queries, schema.QUERIES_ARTIFACTS)
        reranked = Path(tmp) / f"{name}.reranked.trec"
        write_trec_run(result.reranking.run, reranked, tag=run_tag)
        tracker.log_file(run_id, reranked, "runs")
        first_stage = Path(tmp) / f"{name}.{schema.FIRST_STAGE}.trec"
        first_stage.write_bytes(Path(result.first_stage_run).read_bytes())
        tracker.log_file(run_id, first_stage, "runs")


# ----------------------------------------------------------------------------- results


@dataclass
class Ranking:
    """One ranking's measures on one set of queries (``model`` is the final ranking)."""

    model: dict[str, float]
    first_stage: dict[str, float]
    cross_encoder: dict[str, float] = field(default_factory=dict)  # when the final ranking is fused
    weight: float | None = None


@dataclass
class TrialResult:
    """A trial's outcome, typed: read from its MLflow run by schema name, in one place."""

    run_id: str
    reused: bool
    best_epoch: int
    validation: Ranking
    tests: dict[str, Ranking]  # target name -> its rankings
    timings: dict[str, float]

    @classmethod
    def from_metrics(cls, run_id: str, reused: bool, metrics: dict[str, float], target_names: Sequence[str]) -> TrialResult:
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
        return cls(run_id, reused, int(metrics.get(schema.BEST_EPOCH, 0)), validation, tests, timings)


# ----------------------------------------------------------------------------- selectors


def requirements_needed(specs: Sequence) -> list:
    """The distinct trials these trials require first (a supervised augmentation's selector), in order."""
    from workloads.kinds import requirements

    return requirements(specs)


def requirement_run_key(required) -> str:
    from workloads.kinds import kind_of

    kind = kind_of(required)
    return f"{kind.name}:{kind.key(required)}"


def _close_finished_requirement(tracker: Tracker, experiment_id: str, run_key: str, kept: Path, result_file: str) -> None:
    """A result kept, then the driver died before its run was closed: close it with the kept summary."""
    import json

    open_run = tracker.find_run(experiment_id, run_key)
    if open_run is not None and open_run.info.status != "FINISHED":
        summary = json.loads((kept / result_file).read_text())
        tracker.log_metrics(open_run.info.run_id, {k: v for k, v in summary.items() if isinstance(v, (int, float))})
        tracker.set_tags(open_run.info.run_id, {schema.CHECKPOINT_TAG: str(kept)})
        tracker.finish(open_run.info.run_id, "FINISHED")


def ensure_requirement(required, tracker: Tracker, experiment_id: str, storage_path: Path, ray_address: str | None = None,
                       tags: dict[str, str] | None = None, interrupted=None) -> Path:
    """A required trial's kept result (a trained selector, an EAR trial): the one kept already (by any earlier
    command), else trained now with the kind's lifecycle steps and tracked as one run of the
    kind's name: its config, per-epoch metrics, the chosen epoch's validation and its test
    ranking (BM25 beside it), the checkpoint. A crashed attempt resumes from its last epoch
    (its Ray Train run name is the content key) in the same MLflow run. ``interrupted``: a flag
    (``is_set()``) that says an error came from the command being stopped (a sweep trains its
    requirements in threads, which Ctrl-C does not reach): the run is then KILLED, not FAILED."""
    import ray

    from workloads.kinds import kind_of, result_summary

    kind = kind_of(required)
    run_key = requirement_run_key(required)
    done = kind.finished(required)
    if done is not None:
        _close_finished_requirement(tracker, experiment_id, run_key, done, kind.result_file)
        log.info("%s %s already trained: reusing %s", kind.name, required.name, done)
        return done

    started = time.perf_counter()
    prepared = kind.prepare(required)
    prepare_seconds = time.perf_counter() - started
    params = schema.flat_params(required)
    run_tags = {**schema.requirement_tags(required), **(tags or {})}
    run_id = tracker.start_trial_run(experiment_id, required.name, run_key, params, run_tags, kind=kind.name)
    try:
        tracker.log_json(run_id, "", "config.json", required.model_dump(mode="json"))
        tracker.log_json(run_id, "", "data_stats.json", prepared.data_stats)
        tracker.log_metrics(run_id, prepared.first_stage_validation, prefix=schema.first_stage_prefix("val"))
        init_ray(ray_address)
        log.info("training the %s trial %s (%s)", kind.name, required.name, run_key)
        train_started = time.perf_counter()
        epochs = train_on_ray(required, kind.worker_inputs(prepared), storage_path, f"{kind.name}-{kind.key(required)}")
        train_wall = time.perf_counter() - train_started
        summary, best = log_training(tracker, run_id, epochs)
        test_started = time.perf_counter()
        from orchestrator.core.execution import submit_task

        [test] = submit_evaluations(required, targets(required), best.checkpoint, None, best.metrics, prepared)
        result = test.result()
        tested = result.reranking
        log_target(tracker, run_id, result, run_tag=f"rerank-lab.{required.name}")
        metrics = {**summary, **timing(train_wall, summary), schema.TIME_PREPARE: prepare_seconds,
                   schema.TIME_EVALUATION: time.perf_counter() - test_started, schema.TIME_TRIAL: time.perf_counter() - started,
                   schema.EPOCHS_RUN: float(len(epochs))}
        tracker.log_metrics(run_id, metrics)
        # where the test ran (the trial's resources, a GPU where there is one): keeping an EAR trial
        # scores every query's expansions once more
        path = ray.get(submit_task(required, kind.keep, required, Path(best.checkpoint),
                                   {**result_summary(best.metrics, tested), **metrics}))
        tracker.set_tags(run_id, {schema.CHECKPOINT_TAG: str(path)})
        tracker.finish(run_id, "FINISHED")
        log.info("%s %s: chosen epoch %d of %d, val nDCG@10 %.4f, test nDCG@10 %.4f", kind.name, required.name,
                 int(best.metrics["epoch"]), len(epochs), best.metrics[schema.OBJECTIVE],
                 tested.evaluation.aggregate["ndcg_at_10"])
    except KeyboardInterrupt:
        tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})  # a rerun resumes it from its last epoch
        tracker.finish(run_id, "KILLED")
        raise
    except BaseException as exc:
        if interrupted is not None and interrupted.is_set():  # stopped with the sweep: a rerun resumes it
            tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})
            tracker.finish(run_id, "KILLED")
        else:
            tracker.fail(run_id, "error", exc)  # never reported as complete; a rerun resumes it
        raise
    return path


# ----------------------------------------------------------------------------- `orchestrate run`


def preflight_trial(spec: TrialSpec) -> list[str]:
    """What would stop a trial before it computes anything, found without preparing: a model
    that cannot load here, a collection that is neither local nor an ir_datasets id, a GloVe or
    run file that does not exist. One line each."""
    from workloads.data.collections import local_directory
    from workloads.models.cross_encoder import require_model_available
    from workloads.text.glove import resolve_glove_path

    problems: dict[str, None] = {}

    def check(call, *args) -> None:
        try:
            call(*args)
        except InputError as exc:
            problems[str(exc)] = None

    check(require_model_available, spec.model.name)
    for reference in dict.fromkeys(r for r in (spec.data.collection, spec.data.test_collection) if r):
        if local_directory(reference) is None:
            check(require_known_dataset, reference)
    for path in (spec.augmentation.glove_path, spec.augmentation.selector.glove_path if spec.augmentation.selector else None):
        if path:
            check(resolve_glove_path, path)
    for first_stage in (spec.first_stage, spec.data.test_first_stage):
        if first_stage is not None and first_stage.path and not Path(first_stage.path).expanduser().is_file():
            problems[f"{first_stage.path}: first_stage path: no such run file"] = None
        if first_stage is not None and first_stage.method == "ear":
            from workloads.expansion.kind import load_ear_trial

            try:
                problems.update(dict.fromkeys(ear_preflight(load_ear_trial(first_stage.run))))
            except InputError as exc:
                problems[str(exc)] = None
    # (a sweep's dry run lists the prebuilt index names it cannot search with its staging problems)
    problems.update(dict.fromkeys(configuration_problems(spec, indexes=False)))
    return list(problems)


def configuration_problems(spec: TrialSpec, indexes: bool = True) -> list[str]:
    """What in a trial's file can never run, whatever is installed or downloaded, found offline
    without preparing: a prebuilt index the catalog bundled with Pyserini does not hold,
    ``scoreddocs`` of a local collection (it ships no run), an EAR first stage over other data
    than the trial's, more batches per optimizer step than an epoch can have. One line each;
    ``run`` and ``prepare`` refuse the first (:func:`refuse_configuration_problems`).
    ``indexes``: check the prebuilt index names too."""
    from workloads.data.collections import local_directory, same_collection
    from workloads.retrieval.prebuilt import check_first_stage_index

    data = spec.data
    test_collection = data.test_collection or data.collection
    served = [("first_stage", spec.first_stage, data.collection, data.train_split)]
    if data.validation_split:
        served.append(("first_stage", spec.first_stage, data.collection, data.validation_split))
    served.append(("data.test_first_stage", data.test_first_stage, test_collection, data.test_split) if data.test_first_stage
                  else ("first_stage", spec.first_stage, test_collection, data.test_split))
    problems: dict[str, None] = {}
    for where, first_stage, collection, split in served:
        try:
            if first_stage.method in ("bm25", "rm3") and indexes:
                check_first_stage_index(first_stage.index, collection, f"{where}.index")
            elif first_stage.method == "scoreddocs" and local_directory(collection) is not None:
                raise InputError(f"{where}.method", f"scoreddocs reads the run an ir_datasets collection ships; "
                                                    f"{collection} is a local collection, which ships none: use bm25, or "
                                                    "method run with a TREC run file")
            elif first_stage.method == "ear":
                from workloads.expansion.kind import load_ear_trial

                ear = load_ear_trial(first_stage.run).data
                ranked = list(dict.fromkeys(s for s in (ear.train_split, ear.validation_split, ear.test_split) if s))
                if not same_collection(collection, ear.collection) or split not in ranked:
                    raise InputError(f"{where}.run {first_stage.run}",
                                     f"the EAR trial ranks {ear.collection} ({', '.join(ranked)}), not {collection} "
                                     f"{split}: an EAR first stage serves trials on its own data")
        except InputError as exc:
            problems[str(exc)] = None
    step = _step_problem(spec)
    if step:
        problems[step] = None
    return list(problems)


def _step_problem(spec: TrialSpec) -> str | None:
    """More batches per optimizer step (x workers) than the training set can make in an epoch:
    no step would ever happen. Counted at most (every row kept, the last batch full)."""
    from workloads.batching import rows_per_batch

    opt, size, negatives = spec.optimization, spec.training_data.size, spec.training_data.negatives
    if not isinstance(size, int):  # size: full, known only once prepared (the trial refuses then)
        return None
    rows = size // (1 + negatives)
    batches = rows // max(1, rows_per_batch(opt.batching, opt.batch_size, negatives))
    workers = spec.resources.workers
    if batches // (workers * opt.gradient_accumulation) >= 1:
        return None
    most = batches // workers
    remedy = (f"give at most {most}" if most >= 1 else "lower optimization.batch_size (no single batch is full)")
    return (f"optimization.gradient_accumulation: {opt.gradient_accumulation} batches per step x {workers} worker(s), "
            f"but training_data.size {size} makes at most {batches} batch(es) of optimization.batch_size "
            f"{opt.batch_size} an epoch: no optimizer step would happen; {remedy}")


def refuse_configuration_problems(specs, source: str) -> None:
    """One line (exit 2) for the first of :func:`configuration_problems` of any of ``specs``
    (re-ranking trials; EAR trials have none of these), before anything is prepared or written."""
    seen: set[str] = set()
    for spec in specs:
        if type(spec) is not TrialSpec:  # (a unit lists its required trials too: they have their own checks)
            continue
        if (identity := spec.model_dump_json()) in seen:
            continue
        seen.add(identity)
        problems = configuration_problems(spec)
        if problems:
            raise InputError(f"{source}: trial {spec.name}", problems[0])


def ear_preflight(spec) -> list[str]:
    """What would stop an EAR trial before it computes anything: its model, its collection, its
    expansion source's model or file. One line each."""
    from workloads.data.collections import local_directory
    from workloads.models.cross_encoder import require_model_available

    problems: dict[str, None] = {}

    def check(call, *args, **kwargs) -> None:
        try:
            call(*args, **kwargs)
        except InputError as exc:
            problems[str(exc)] = None

    check(require_model_available, spec.model.name)
    if spec.expansion.source == "generator":
        check(require_model_available, spec.expansion.model, field="expansion.model")
    if spec.expansion.source == "file" and not Path(spec.expansion.path).expanduser().is_file():
        problems[f"{spec.expansion.path}: expansion path: no such file"] = None
    for reference in dict.fromkeys(r for r in (spec.data.collection, spec.data.test_collection) if r):
        if local_directory(reference) is None:
            check(require_known_dataset, reference)
    return list(problems)


def require_known_dataset(reference: str) -> None:
    """An ir_datasets id it knows (nothing is downloaded: loading an id reads its registry only)."""
    try:
        import ir_datasets

        ir_datasets.load(reference)
    except KeyError:
        raise InputError(reference, "unknown dataset: not a local directory, not under $ORCHESTRATE_DATA_DIR, "
                                    "not an ir_datasets id") from None


def _finished_run(tracker: Tracker, key: str, data: str, test_data: str):
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


def _ensure_requirements(spec: TrialSpec, tracker: Tracker, experiment: str, storage_path: Path,
                         ray_address: str | None) -> None:
    """Every trial ``spec`` requires (a supervised augmentation's selector), trained once and
    tracked, before the trial's own data is prepared."""
    from workloads.kinds import kind_of

    required = requirements_needed([spec])
    for each in required:
        kind_of(each).prepare(each)  # their data is known good before MLflow is written
    if required:
        init_ray(ray_address)
        for each in [spec, *required]:  # a worker no node can hold is refused before anything waits forever
            check_resources(each)
        experiment_id = tracker.experiment_id(experiment)
        for each in required:
            ensure_requirement(each, tracker, experiment_id, storage_path, ray_address)


def run_trial(spec: TrialSpec, tracker: Tracker, storage_path: Path, ray_address: str | None = None,
              force: bool = False, experiment: str | None = None) -> TrialResult:
    """One trial end to end as one MLflow run. The same trial (same resolved config, whatever its
    name) finished in any experiment of this store on the same data is reused, not recomputed
    (``force`` reruns). A finished run of the same configuration on data that has changed since
    keeps its results under a stale identity, and the trial runs again."""
    key = schema.trial_key(spec)
    evaluation_targets = targets(spec)
    names = [t.name for t in evaluation_targets]
    data = training_data_identity(spec)
    test_data = test_data_identity(evaluation_targets)
    finished = None if force else _finished_run(tracker, key, data, test_data)
    if finished is not None:
        return TrialResult.from_metrics(finished.info.run_id, True, dict(finished.data.metrics), names)

    started = time.perf_counter()
    log.info("preparing data for trial %s (%s)", spec.name, key)
    _ensure_requirements(spec, tracker, experiment or spec.name, storage_path, ray_address)
    prepared = prepare_trial(spec)
    for target in evaluation_targets[1:]:  # every target's data before training: a bad one stops the trial now
        prepare_trial(target.spec)
    prepare_seconds = time.perf_counter() - started
    init_ray(ray_address)
    check_resources(spec)  # a worker no node can hold would wait forever: refused before the trial's run is written

    experiment_id = tracker.experiment_id(experiment or spec.name)  # written only once the inputs are known good
    run_id = tracker.start_trial_run(experiment_id, spec.name, key, schema.flat_params(spec),
                                     {**schema.axes(spec), schema.DATA_TAG: data, schema.TEST_DATA_TAG: test_data})
    try:
        tracker.log_metrics(run_id, prepared.first_stage_validation, prefix=schema.first_stage_prefix("val"))
        tracker.log_json(run_id, "", "data_stats.json", prepared.data_stats)
        tracker.log_json(run_id, "", "config.json", spec.model_dump(mode="json"))

        train_started = time.perf_counter()
        # Train V2 restores a run from storage by name: a crashed attempt resumes from its last
        # epoch checkpoint; its data's identity is part of the name, so a run on changed data
        # starts afresh; --force starts a fresh run instead of restoring the finished one.
        run_name = f"{spec.name}-{key}-{data[:8]}" + (f"-{int(time.time())}" if force else "")
        epochs = train_on_ray(spec, prepared.training, storage_path, run_name)
        train_wall = time.perf_counter() - train_started
        summary, best = log_training(tracker, run_id, epochs)
        log.info("chosen epoch %d (%s %.4f); testing %s", int(best.metrics["epoch"]), schema.OBJECTIVE,
                 best.metrics[schema.OBJECTIVE], best.checkpoint)

        test_started = time.perf_counter()
        for pending in submit_evaluations(spec, evaluation_targets, best.checkpoint, best.metrics.get(schema.TUNED_WEIGHT)):
            log_target(tracker, run_id, pending.result(), run_tag=f"rerank-lab.{spec.name}")
        tracker.log_metrics(run_id, {**summary, **timing(train_wall, summary), schema.TIME_PREPARE: prepare_seconds,
                                     schema.TIME_EVALUATION: time.perf_counter() - test_started,
                                     schema.TIME_TRIAL: time.perf_counter() - started})
        tracker.set_tags(run_id, {schema.CHECKPOINT_TAG: best.checkpoint})
        tracker.finish(run_id, "FINISHED")
    except KeyboardInterrupt:
        tracker.set_tags(run_id, {schema.INTERRUPTED_TAG: "true"})  # resumed from its checkpoint by the next run
        tracker.finish(run_id, "KILLED")
        raise
    except BaseException as exc:
        tracker.fail(run_id, "error", exc)  # partial results are never reported as complete
        raise
    return TrialResult.from_metrics(run_id, False, tracker.run_metrics(run_id), names)
