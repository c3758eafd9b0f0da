"""One re-ranking trial's steps on the driver: prepare its data, evaluate a checkpoint on test.

The orchestrator calls :func:`prepare_trial` on the driver, runs
:func:`workloads.kinds.rerank.train.train_cross_encoder` in Ray Train workers and
:func:`evaluate_checkpoint` for the epoch chosen on validation
(:func:`workloads.kinds.choose_epoch`, the rule of every kind); the re-ranking kind's
declaration (:mod:`workloads.kinds.rerank.kind`) names these steps for every command.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ir_measures
import torch

from workloads.core.errors import InputError, RequirementNotTrained
from workloads.core.paths import atomic_path, cache_dir, stable_key
from workloads.data.collections import Collection, Qrels
from workloads.data.resolve import resolve_collection
from workloads.evaluation import AGGREGATE_VERSION, MEASURES, Evaluation, evaluate
from workloads.evaluation.ranking import TIE_ORDER
from workloads.evaluation.reranking import Reranking, rerank_and_evaluate
from workloads.kinds.rerank.augmentation import build_augmentation_sets, rows_without_sentences
from workloads.kinds.rerank.augmentation.scorers import SUPERVISED_METHODS
from workloads.kinds.rerank.augmentation.supervised import trained_selectors
from workloads.kinds.rerank.spec import TrialSpec
from workloads.kinds.rerank.train import TrainingInputs
from workloads.kinds.rerank.training_sets import (
    build_candidates,
    build_training_set,
    capped_validation_queries,
    carve_validation_queries,
    drawable_queries,
)
from workloads.models.cross_encoder import CrossEncoder, require_compiler, require_model_available
from workloads.retrieval.bm25 import read_trec_run
from workloads.retrieval.first_stage import FirstStageRun, first_stage_run
from workloads.retrieval.mining import build_miner
from workloads.text.perturbations import perturb_queries
from workloads.training.epoch_metrics import WEIGHT_METRIC

BASELINE_DEPTH = 1000  # BM25 is scored on its top-1000, as in Pyserini's BEIR regressions


@dataclass(frozen=True)
class PreparedTrial:
    training: TrainingInputs
    test_candidates: str
    test_first_stage_run: str
    test_qrels: Qrels
    test_relevance_level: int
    first_stage_validation: dict[str, float]
    first_stage_test: Evaluation
    data_stats: dict[str, int] = field(default_factory=dict)


def first_stage_evaluation(first_stage: FirstStageRun, qrels: Qrels, relevance_level: int) -> Evaluation:
    """The first stage's evaluation on these judgements, computed once and stored (JSON keeps every
    float exactly): a warm preparation reads neither the run nor ir_measures again."""
    judged = sorted((q, sorted(docs.items())) for q, docs in qrels.items())
    key = stable_key(judged, relevance_level, sorted(MEASURES.items()), ir_measures.__version__, f"aggregate-v{AGGREGATE_VERSION}",
                     TIE_ORDER)
    path = cache_dir() / "evaluations" / f"{first_stage.key}-{key}.json"
    if path.exists():
        return Evaluation(**json.loads(path.read_text()))
    evaluation = evaluate(first_stage.run, qrels, relevance_level)
    with atomic_path(path, ".json") as tmp:
        tmp.write_text(json.dumps(asdict(evaluation)))
    return evaluation


def require_disjoint(collection: Collection, query_sets: dict[str, object]) -> None:
    """Train, validation and test queries of one collection must not overlap: a shared query
    would be trained on, or chosen on, and then reported as held out."""
    names = list(query_sets)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = sorted(set(query_sets[first]) & set(query_sets[second]))
            if shared:
                raise InputError(collection.name, f"{first} and {second} queries overlap: {len(shared)} shared "
                                                  f"(e.g. '{shared[0]}'); a split must be held out")


class SelectorNotTrained(RequirementNotTrained):
    """A trial augments with a supervised selector that is not trained yet."""


def required_selector(spec: TrialSpec) -> Path | None:
    """The trained selector a supervised augmentation needs (None for the other methods).

    Training it comes first (the trial kind's requirement): ``orchestrate run`` and ``sweep``
    train it as its own tracked run, :func:`workloads.kinds.run_in_process` in-process."""
    if spec.augmentation.method not in SUPERVISED_METHODS:
        return None
    served = trained_selectors()
    selector = served.trial(spec)
    path = served.trained(selector)
    if path is None:
        raise SelectorNotTrained(spec.name, f"its {selector.method} selector is not trained yet ({served.kept_in(selector)}): "
                                            "`orchestrate run` and `orchestrate sweep` train it first")
    return path


def _training_queries(spec: TrialSpec, collection: Collection):
    """(train queries, the ids trained on, validation queries, their judgements): the validation
    split's, or queries carved from the training split."""
    train_queries = collection.split_queries(spec.data.train_split)
    if spec.data.validation_split:
        queries = collection.split_queries(spec.data.validation_split)
        qrels = collection.split_qrels(spec.data.validation_split)
        if spec.data.validation_cap is not None:
            kept = capped_validation_queries(list(queries), spec.data.validation_cap)
            queries, qrels = {q: queries[q] for q in kept}, {q: qrels[q] for q in kept}
        return train_queries, list(train_queries), queries, qrels
    train_ids, validation_ids = carve_validation_queries(
        list(train_queries), spec.data.validation_queries, f"{collection.name} {spec.data.train_split}")
    train_qrels = collection.split_qrels(spec.data.train_split)
    return (train_queries, train_ids, {q: train_queries[q] for q in validation_ids},
            {q: train_qrels[q] for q in validation_ids})


def _test_queries(spec: TrialSpec, collection: Collection):
    """(test collection, test queries, their judgements); with ``data.test_perturbation`` the
    queries that have a variant, as perturbed (CFT)."""
    same_collection = spec.data.test_collection in (None, spec.data.collection)
    test_collection = collection if same_collection else resolve_collection(spec.data.test_collection)
    test_queries = test_collection.split_queries(spec.data.test_split)
    test_qrels = test_collection.split_qrels(spec.data.test_split)
    if spec.data.test_perturbation:
        test_queries = perturb_queries(test_queries, spec.data.test_perturbation)
        test_qrels = {q: test_qrels[q] for q in test_queries}
        if not test_queries:
            raise InputError(test_collection.name, f"no {spec.data.test_split} query has a '{spec.data.test_perturbation}' variant")
    return test_collection, test_queries, test_qrels


def prepare_trial(spec: TrialSpec) -> PreparedTrial:
    """Everything a trial's workers read, computed once and cached by content."""
    fs = spec.first_stage
    require_model_available(spec.model.name)  # before anything is computed or written
    if spec.optimization.compile:
        require_compiler()
    collection = resolve_collection(spec.data.collection)
    train_queries, train_ids, validation_queries, validation_qrels = _training_queries(spec, collection)
    test_collection, test_queries, test_qrels = _test_queries(spec, collection)
    same_collection = test_collection is collection
    # before anything is computed: a shared query would be trained or chosen on, then reported as held out
    require_disjoint(collection, {"train": train_ids, "validation": validation_queries,
                                  **({"test": test_queries} if same_collection else {})})

    split = spec.data.train_split
    mining = spec.training_data.mining  # negatives mined by a trained model (workloads.retrieval.mining)
    miner = None if mining is None else build_miner(mining, collection)
    if spec.training_data.queries == "as_needed":  # retrieved a chunk at a time, as far as the set needs
        def retrieve(chunk: list[str]):
            return first_stage_run(collection, split, {q: train_queries[q] for q in chunk}, fs.train_depth, fs)

        training_set, stats = build_training_set(
            collection, split, train_ids, None, fs.train_depth, spec.training_data.size, spec.training_data.seed,
            spec.training_data.negatives, retrieve=retrieve, miner=miner)
    else:
        # only the queries that can yield a row (a judged-relevant document): the same rows
        drawable = drawable_queries(train_ids, collection.split_qrels(split), collection.relevance_level) or train_ids
        train_run = first_stage_run(collection, split, {q: train_queries[q] for q in drawable}, fs.train_depth, fs)
        training_set, stats = build_training_set(
            collection, split, train_ids, train_run, fs.train_depth,
            spec.training_data.size, spec.training_data.seed, spec.training_data.negatives, miner=miner)

    augmentations: list[Path] = []
    augmentation_stats: dict[str, int] = {}
    if spec.augmentation.method != "none":
        augmentations = build_augmentation_sets(collection, spec.data.train_split, training_set, spec.augmentation,
                                                spec.optimization.epochs, selector=required_selector(spec))
        # rows whose document has no sentence get no augmented pair (counted, epoch 1's draw)
        augmentation_stats["augmentation_rows_without_sentences"] = rows_without_sentences(augmentations[0])

    validation_run = first_stage_run(collection, spec.data.validation_split or spec.data.train_split, validation_queries,
                                     BASELINE_DEPTH, fs)
    validation_candidates = build_candidates(collection, validation_queries, validation_run, fs.validation_depth)
    first_stage_validation = first_stage_evaluation(validation_run, validation_qrels, collection.relevance_level).aggregate

    test_fs = spec.data.test_first_stage or fs
    test_run = first_stage_run(test_collection, spec.data.test_split, test_queries, BASELINE_DEPTH, test_fs)
    test_candidates = build_candidates(test_collection, test_queries, test_run, test_fs.test_depth)

    return PreparedTrial(
        training=TrainingInputs(
            training_set=str(training_set),
            validation_candidates=str(validation_candidates),
            validation_first_stage_run=str(validation_run.path),
            validation_qrels=validation_qrels,
            relevance_level=collection.relevance_level,
            augmentations=tuple(str(p) for p in augmentations),
        ),
        test_candidates=str(test_candidates),
        test_first_stage_run=str(test_run.path),
        test_qrels=test_qrels,
        test_relevance_level=test_collection.relevance_level,
        first_stage_validation=first_stage_validation,
        first_stage_test=first_stage_evaluation(test_run, test_qrels, test_collection.relevance_level),
        data_stats={"train_queries": len(train_ids), "validation_queries": len(validation_queries),
                    "test_queries": len(test_queries), **{f"triples_{k}": v for k, v in asdict(stats).items()},
                    **augmentation_stats},
    )


def final_interpolation(spec: TrialSpec, tuned_weight: float | None) -> float | str:
    """The interpolation the test ranking uses: none, the fixed weight, or ``tuned_weight``,
    the weight tuned on validation at the chosen epoch (never tuned on test)."""
    setting = spec.reranking.interpolation
    if setting != "tuned":
        return setting
    if tuned_weight is None:
        raise ValueError(f"{spec.name}: interpolation is 'tuned' but the chosen epoch recorded no {WEIGHT_METRIC} "
                         "(trained before interpolation was set?); rerun it with --force")
    return tuned_weight


def evaluate_checkpoint(
    checkpoint: Path, prepared: PreparedTrial, spec: TrialSpec, device: torch.device | None = None,
    interpolation: float | str = "none",
) -> Reranking:
    """Re-rank the test candidates with a trained checkpoint (see :func:`final_interpolation`)."""
    if interpolation == "tuned":
        raise ValueError("the test ranking takes the weight tuned on validation, not 'tuned'")
    device = device or torch.device("cpu")
    model = CrossEncoder.from_pretrained(str(checkpoint), spec.model.max_length, spec.model.pooling).to(device)
    return rerank_and_evaluate(
        model, Path(prepared.test_candidates), read_trec_run(Path(prepared.test_first_stage_run)),
        prepared.test_qrels, prepared.test_relevance_level, spec.optimization.eval_batch_size, device, label="test",
        interpolation=interpolation, precision=spec.optimization.precision)
