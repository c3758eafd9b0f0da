"""Where a chosen checkpoint is tested, and how each test is logged.

An evaluation target is a trial spec whose test data is the target: the trial's own test data
first, then each perturbed copy of its test queries, then each zero-shot collection. Every
target is tested by its kind's ``test`` as a Ray task (:func:`submit_evaluations`) and logged
the same way wherever it runs (:func:`log_target`): ``run``, a required trial, a sweep's winner.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow.parquet as pq

from orchestrator.core import schema
from orchestrator.core.execution import submit_task
from orchestrator.core.tracking import Tracker
from workloads.data.identity import local_directory, same_collection
from workloads.data.resolve import resolve_collection
from workloads.evaluation import Evaluation
from workloads.evaluation.reranking import Reranking
from workloads.kinds import kind_of
from workloads.retrieval.bm25 import write_trec_run


@dataclass(frozen=True)
class Target:
    """Where a chosen checkpoint is tested: ``name`` prefixes its metrics, ``label`` names its
    collection for people (``scifact``, ``nfcorpus:dev``), ``spec``'s test data is the target."""

    name: str
    label: str
    spec: object


class ZeroShot(NamedTuple):
    """A zero-shot target: a collection's split, re-ranking its own first stage's candidates where
    one is given (a sweep's ``zero_shot[]``; None: the trial's)."""

    collection: str
    split: str = "test"
    first_stage: object | None = None


def collection_label(collection: str, split: str) -> str:
    return collection.rstrip("/").rsplit("/", 1)[-1] + ("" if split == "test" else f":{split}")


def targets(spec, zero_shot: Sequence[ZeroShot | tuple] = ()) -> list[Target]:
    """The trial's own test data (``data.test_collection`` or its collection, ``test_split``),
    its perturbed copies (``robustness``), then each zero-shot (collection, split[, first
    stage]): a target with its own first stage (a sweep's ``zero_shot[].first_stage``)
    re-ranks that one's candidates. A spec without ``robustness`` (a selector, an EAR trial)
    is tested on its own split only."""
    own = spec.data.test_collection or spec.data.collection
    label = collection_label(own, spec.data.test_split)
    out = [Target(schema.TEST, label, spec)]
    if not hasattr(spec, "robustness"):  # a kind that tests itself on its own split
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


def target_overlap(spec, target: Target, query_ids: bool = True) -> str | None:
    """Why testing ``spec``'s trained model on ``target`` would report seen queries, or None.

    By configuration first (the target is the training or validation split of the training
    collection), then, with ``query_ids``, by the queries themselves where both collections
    are local files (only their queries and judgements are read; nothing is prepared). An
    ir_datasets collection is checked by configuration here and by its queries when the
    trial prepares it (before anything is trained)."""
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


@dataclass
class TargetResult:
    target: Target
    reranking: Reranking      # the final ranking (and the cross-encoder alone when fused)
    first_stage: Evaluation   # the first stage on the same queries
    first_stage_run: str      # its TREC run file
    candidates: str = ""      # the candidates file that was re-ranked (its query texts are logged)


@dataclass
class PendingEvaluation:
    target: Target
    prepared: object
    ref: object  # Ray ObjectRef of a workloads.evaluation.reranking.Reranking

    def result(self) -> TargetResult:
        import ray

        return TargetResult(self.target, ray.get(self.ref), self.prepared.first_stage_test, self.prepared.test_first_stage_run,
                            getattr(self.prepared, "test_candidates", ""))


def submit_evaluations(spec, evaluation_targets: Sequence[Target], checkpoint: str, chosen: dict[str, float],
                       prepared=None) -> list[PendingEvaluation]:
    """Start testing ``checkpoint`` on every target with its kind's ``test`` as Ray tasks (all in
    flight at once, each with the trial's resources). ``chosen``: the chosen epoch's metrics
    (a tuned interpolation weight among them); ``prepared``: the trial's own prepared data
    when the caller holds it (every other target's is prepared here, cached by content: only a
    new target computes anything)."""
    kind = kind_of(spec)
    pending = []
    for target in evaluation_targets:
        data = prepared if prepared is not None and target.spec is spec else kind.prepare(target.spec)
        pending.append(PendingEvaluation(target, data, submit_task(spec, kind.test, Path(checkpoint), data, target.spec,
                                                                   chosen)))
    return pending


def log_target(tracker: Tracker, run_id: str, result: TargetResult, run_tag: str) -> None:
    """One target, logged the same way wherever it runs: the final ranking, the cross-encoder
    alone when fused, the first stage, each with per-query values; the weight; both TREC runs."""
    name = result.target.name
    tracker.log_evaluation(run_id, schema.target_prefix(name), result.reranking.evaluation)
    if result.reranking.weight is not None:
        tracker.log_evaluation(run_id, schema.cross_encoder_prefix(name), result.reranking.cross_encoder)
        tracker.log_metrics(run_id, {schema.weight_metric(name): result.reranking.weight})
    tracker.log_evaluation(run_id, schema.first_stage_prefix(name), result.first_stage)
    with tempfile.TemporaryDirectory() as tmp:
        if result.candidates:  # the query texts the model was tested on (perturbed ones for robust_* targets)
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
