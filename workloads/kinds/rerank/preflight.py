"""What would stop a re-ranking trial, found offline without preparing: :func:`preflight_trial`
(what is not here: a model, a collection, a GloVe or run file) and
:func:`configuration_problems` (what in its file can never run, whatever is installed)."""

from __future__ import annotations

from pathlib import Path

from workloads.core.errors import InputError
from workloads.kinds.protocol import Problems, check_collections, check_mining
from workloads.kinds.rerank.batching import rows_per_batch
from workloads.kinds.rerank.spec import TrialSpec
from workloads.models.cross_encoder import require_model_available
from workloads.retrieval.first_stage import FIRST_STAGES
from workloads.retrieval.prebuilt import check_first_stage_index
from workloads.text.glove import resolve_glove_path


def preflight_trial(spec: TrialSpec) -> list[str]:
    """What would stop a trial before it computes anything, found without preparing: a model
    that cannot load here, a collection that is neither local nor an ir_datasets id, a GloVe or
    run file that does not exist. One line each. (What would stop the trials it requires, an EAR
    first stage's, is theirs: ``orchestrator.lifecycle.preparation.preflight`` asks their kinds.)"""
    problems = Problems()
    problems.check(require_model_available, spec.model.name)
    check_collections(problems, spec.data.collection, spec.data.test_collection)
    for path in (spec.augmentation.glove_path, spec.augmentation.selector.glove_path if spec.augmentation.selector else None):
        if path:
            problems.check(resolve_glove_path, path)
    for first_stage in (spec.first_stage, spec.data.test_first_stage):
        if first_stage is not None and first_stage.path and not Path(first_stage.path).expanduser().is_file():
            problems.add(f"{first_stage.path}: first_stage path: no such run file")
    check_mining(problems, spec.training_data.mining)
    for where, first_stage, collection, split in served_first_stages(spec):
        problems.check(FIRST_STAGES[first_stage.method].preflight, first_stage, collection, split, where)
    # (a sweep's dry run lists the prebuilt index names it cannot search with its staging problems)
    for line in configuration_problems(spec, indexes=False):
        problems.add(line)
    return problems.list()


def configuration_problems(spec: TrialSpec, indexes: bool = True) -> list[str]:
    """What in a trial's file can never run, whatever is installed or downloaded, found offline
    without preparing: a prebuilt index the catalog bundled with Pyserini does not hold, a
    first stage that can never serve the data (``FirstStageMethod.check``: ``scoreddocs`` of a
    local collection, an EAR first stage over other data than the trial's), more batches per
    optimizer step than an epoch can have. One line each; ``run`` and ``prepare`` refuse the
    first. ``indexes``: check the prebuilt index names too."""
    problems = Problems()
    for where, first_stage, collection, split in served_first_stages(spec):
        method = FIRST_STAGES[first_stage.method]
        try:
            if method.searches_index and indexes:
                check_first_stage_index(first_stage.index, collection, f"{where}.index")
            method.check(first_stage, collection, split, where)
        except InputError as exc:
            problems.add(str(exc))
    step = _step_problem(spec)
    if step:
        problems.add(step)
    return problems.list()


def served_first_stages(spec: TrialSpec) -> list[tuple]:
    """(where, first stage, collection, split) of every split the trial reads a first stage of."""
    data = spec.data
    test_collection = data.test_collection or data.collection
    served = [("first_stage", spec.first_stage, data.collection, data.train_split)]
    if data.validation_split:
        served.append(("first_stage", spec.first_stage, data.collection, data.validation_split))
    served.append(("data.test_first_stage", data.test_first_stage, test_collection, data.test_split) if data.test_first_stage
                  else ("first_stage", spec.first_stage, test_collection, data.test_split))
    return served


def _step_problem(spec: TrialSpec) -> str | None:
    """More batches per optimizer step (x workers) than the training set can make in an epoch:
    no step would ever happen. Counted at most (every row kept, the last batch full)."""
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
