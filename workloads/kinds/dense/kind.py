"""The dense trial kind's declaration (``KIND``): what the control plane asks of it.

Registered with one line in :data:`workloads.kinds.TRIAL_KINDS`; nothing outside this package
names it. Its steps: prepare, test and keep (:mod:`.steps`), train (:mod:`.train`, the one epoch
loop); its spec, identity and searched parameters (learning rate,
temperature, lambda, masking ratio: typed declarations) :mod:`.spec`; its sweep grid :mod:`.grid`.
"""

from __future__ import annotations

from workloads.kinds.dense.first_stage import DENSE_FIRST_STAGE, HYBRID_FIRST_STAGE
from workloads.kinds.dense.grid import DENSE_GRID, dense_axes, searched_in
from workloads.kinds.dense.mining import CROSS_ENCODER_MINER, DENSE_MINER
from workloads.kinds.dense.preflight import dense_models, dense_preflight, prepare_checked
from workloads.kinds.dense.spec import (
    COMPLETE_MARKER,
    SEARCHED_PARAMETERS,
    DenseTrialSpec,
    dense_dir,
    dense_key,
    trained_dense,
)
from workloads.kinds.dense.steps import keep_dense, test_dense
from workloads.kinds.dense.train import STATE_FILE, DenseInputs, train_dense
from workloads.kinds.protocol import SearchedParameter, TrialKind

# What a dense cell's search draws, and where each value sits in its trial spec (from the spec's declarations).
SEARCHED = tuple(SearchedParameter(name=p.field, path=("dense", p.field), description=p.description)
                 for p in SEARCHED_PARAMETERS)

# Documents of the corpora a dense test encodes whole (the estimate's test cost); others: unknown (None).
CORPUS_DOCUMENTS = {"beir/scifact": 5_183, "beir/nfcorpus": 3_633, "beir/fiqa": 57_638, "beir/trec-covid": 171_332,
                    "msmarco-document": 3_213_835, "msmarco-document/trec-dl-2019/judged": 3_213_835,
                    "msmarco-passage": 8_841_823}


def cell_pairs(spec: DenseTrialSpec, sweep, judged_queries) -> tuple[int | None, int | None, int | None]:
    """A dense cell's cost in sequences of ``model.max_length`` (what the estimate counts as
    pairs): per epoch every row's anchor (a query counts its share of max_length), positive and
    hard negatives, twice with diffcse (the discriminator reads the anchor and the positive,
    forward and backward); every validation query's candidates per epoch; the winner's test
    encodes the whole test corpus and its queries."""
    settings, data = spec.dense, spec.data
    size = spec.training_data.size if isinstance(spec.training_data.size, int) else None
    negatives = spec.training_data.negatives
    query_share = spec.model.query_max_length / spec.model.max_length
    rows = None if size is None else (size if settings.unsupervised else size // (1 + negatives))
    per_row = (1.0 if settings.unsupervised else query_share) + 1 + (negatives if settings.hard_negatives else 0)
    rtd = 2 if settings.objective == "diffcse" else 1
    train = None if rows is None else int(rows * per_row * rtd * settings.epochs)
    if data.validation_split is None:
        queries = data.validation_queries
    else:
        queries = data.validation_cap or judged_queries(data.collection, data.validation_split)
    validation = None if queries is None else queries * spec.first_stage.validation_depth * settings.epochs
    target = data.test_collection or data.collection
    documents, test_queries = CORPUS_DOCUMENTS.get(target), judged_queries(target, data.test_split)
    test = None if documents is None or test_queries is None else int(documents + test_queries * query_share)
    return train, validation, test


KIND = TrialKind(
    "dense", DenseTrialSpec, DenseInputs, requires=lambda spec: [], prepare=prepare_checked,
    worker_inputs=lambda prepared: prepared.inputs, train=train_dense, test=test_dense,
    epochs=lambda spec: spec.dense.epochs, finished=trained_dense, keep=keep_dense, key=dense_key,
    result_file=COMPLETE_MARKER, state_file=STATE_FILE, described_as="dense", run_kind="dense",
    searched=SEARCHED, searched_in=searched_in, axes=dense_axes, grid=DENSE_GRID, cell_pairs=cell_pairs,
    title="dense trial", kept_in=dense_dir, first_stages=(DENSE_FIRST_STAGE, HYBRID_FIRST_STAGE),
    miners=(DENSE_MINER, CROSS_ENCODER_MINER), preflight=dense_preflight, models=dense_models,
)

__all__ = ["CORPUS_DOCUMENTS", "KIND", "SEARCHED", "cell_pairs"]
