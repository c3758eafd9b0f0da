"""What would stop a dense trial, found offline without preparing (:func:`dense_preflight`),
the Hugging Face models it loads (:func:`dense_models`: ``prepare`` fetches each), and its
preparation with the generator checked on the driver (:func:`prepare_checked`)."""

from __future__ import annotations

from pathlib import Path

from workloads.kinds.dense.spec import FREQUENCY_GENERATOR, DenseTrialSpec
from workloads.kinds.dense.steps import prepare_dense
from workloads.kinds.protocol import Problems, check_collections, check_mining
from workloads.models.cross_encoder import require_model_available

GENERATOR_FIELD = "dense.generator"


def dense_models(spec: DenseTrialSpec) -> list[tuple[str, str]]:
    """(field, model) of each model the trial loads: the encoder, and diffcse's masked-LM generator
    (``frequency`` is no model)."""
    models = [("model.name", spec.model.name)]
    if spec.dense.objective == "diffcse" and spec.dense.generator != FREQUENCY_GENERATOR:
        models.append((GENERATOR_FIELD, spec.dense.generator))
    return models


def dense_preflight(spec: DenseTrialSpec) -> list[str]:
    """Its encoder and generator (loadable here), its collections, its first stage's run file. One line each."""
    problems = Problems()
    for field, name in dense_models(spec):
        problems.check(require_model_available, name, field=field)
    check_collections(problems, spec.data.collection, spec.data.test_collection)
    check_mining(problems, spec.training_data.mining)
    path = spec.first_stage.path
    if path and not Path(path).expanduser().is_file():
        problems.add(f"{path}: first_stage path: no such run file")
    return problems.list()


def prepare_checked(spec: DenseTrialSpec):
    """The trial's data (:func:`~workloads.kinds.dense.steps.prepare_dense`, which checks the
    encoder), the generator checked first: it is loaded only in the workers, where a generator
    that cannot load here failed every attempt of the training run instead of one line now."""
    if spec.dense.objective == "diffcse" and spec.dense.generator != FREQUENCY_GENERATOR:
        require_model_available(spec.dense.generator, field=GENERATOR_FIELD)
    return prepare_dense(spec)


__all__ = ["dense_models", "dense_preflight", "prepare_checked"]
