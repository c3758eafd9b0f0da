"""Contract tests over the registries (as Optuna tests every sampler): every loss and every
augmentation scorer is configurable from YAML, constructible from its spec, and every
hyper-parameter a loss declares searchable can be searched by a sweep; every trial kind
names its whole lifecycle."""

import dataclasses
import inspect
import random

import pytest
import torch
import yaml
from pydantic import BaseModel

from orchestrator.core.config import load_spec
from orchestrator.sweep.grid import Cell, SearchSpec
from workloads.data.collections import Collection
from workloads.data.document import Document
from workloads.kinds import TRIAL_KINDS, kind_of, requirements
from workloads.kinds.dense.spec import DenseTrialSpec
from workloads.kinds.ear.spec import EarTrialSpec
from workloads.kinds.rerank.augmentation import build_scorer
from workloads.kinds.rerank.augmentation.scorers import SCORERS, SUPERVISED_METHODS
from workloads.kinds.rerank.batching import triples_to_batch
from workloads.kinds.rerank.spec import LOSS_HYPERPARAMETERS, AugmentationSpec, LossSpec, TrialSpec
from workloads.kinds.selector import SELECTORS
from workloads.kinds.selector.select_and_rank import SelectAndRank
from workloads.kinds.selector.spec import SELECTOR_METHODS, selector_trial
from workloads.losses import (
    CONTRASTIVE_LOSSES,
    PARAMETERS,
    RANKING_LOSSES,
    WEIGHTINGS,
    ModelOutputs,
    PairLoss,
    Parameter,
    build_loss,
    collect_declarations,
    needs_augmentation,
)

ROWS = [{"query_id": q, "query": f"query {q}", "positive": f"relevant {q}", "negative": f"other {q}",
         "augmented_positive": f"part of relevant {q}", "augmented_negative": f"random {q}"} for q in ("a", "a", "b")]
ALL_LOSSES = [("ranking", name) for name in RANKING_LOSSES] + [("contrastive", name) for name in CONTRASTIVE_LOSSES]


def spec_for(kind: str, name: str) -> LossSpec:
    return LossSpec(ranking=name) if kind == "ranking" else LossSpec(contrastive=name)


def _teacher(kind: str, name: str) -> dict:
    """A loss that regresses on a teacher's scores trains on mined negatives (which carry them)."""
    cls = (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name]
    return {"training_data": {"mining": {"method": "dense", "model": "minilm-l6"}}} if cls.needs_teacher else {}


@pytest.mark.parametrize("kind, name", ALL_LOSSES)
def test_every_loss_is_configurable(kind, name, tmp_path):
    trial = {"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, "loss": {kind: name},
             "augmentation": {"method": "bm25"}, **_teacher(kind, name)}
    path = tmp_path / "trial.yaml"

    path.write_text(yaml.safe_dump(trial))
    spec = load_spec(path, TrialSpec)
    assert getattr(spec.loss, kind) == name
    assert TrialSpec.model_validate(spec.model_dump(mode="json")) == spec  # a dumped spec validates again


@pytest.mark.parametrize("kind, name", ALL_LOSSES)
def test_every_loss_is_constructible_with_its_declared_hyperparameters(kind, name):
    cls = (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name]
    accepted = set(inspect.signature(cls.__init__).parameters)
    for field, argument in cls.hyperparameters.items():
        assert field in LossSpec.model_fields, f"{name} declares '{field}', which LossSpec does not have"
        assert argument in accepted, f"{name}.__init__ has no argument '{argument}'"
    assert set(cls.searchable) <= set(cls.hyperparameters)
    loss = build_loss(spec_for(kind, name), hidden_size=4)
    batch = triples_to_batch(ROWS)
    torch.manual_seed(0)
    phi = torch.randn(len(batch.documents), 4, requires_grad=True)
    value = loss(ModelOutputs(torch.randn(len(batch.documents), requires_grad=True), phi), batch.structure)
    assert torch.isfinite(value) and value.ndim == 0
    # its state (counters included) survives a checkpoint
    restored = build_loss(spec_for(kind, name), hidden_size=4)
    restored.load_state_dict(loss.state_dict())
    assert restored.degenerate_batches == loss.degenerate_batches


@pytest.mark.parametrize("kind, name", ALL_LOSSES)
def test_every_searchable_hyperparameter_can_be_searched(kind, name):
    cls = (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name]
    spec = TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"},
                                     "loss": {kind: name}, "augmentation": {"method": "bm25"}, **_teacher(kind, name)})
    cell = Cell("cell-0", {}, spec, None, False)
    for field in cls.searchable:
        assert field in cell.searched
        alias = SearchSpec.model_fields[field].alias or field
        assert alias in SearchSpec.model_fields or field in SearchSpec.model_fields  # a sweep file can give it a range
        default = LossSpec.model_fields[field].default
        changed = kind_of(spec).apply_params(spec, {field: default * 1.5})
        assert getattr(changed.loss, field) == pytest.approx(default * 1.5)


@pytest.mark.parametrize("method", sorted(SCORERS))
def test_every_augmentation_scorer_is_configurable_and_constructible(method, tmp_path, tiny_model_dir):
    glove = tmp_path / "glove.txt"
    glove.write_text("cats 1 0\npurr 0 1\n")
    spec = AugmentationSpec(method=method, glove_path=str(glove) if method == "glove" else None)

    selector = None
    if method in SUPERVISED_METHODS:  # a supervised scorer reads a trained selector's directory

        selector = tmp_path / "selector"
        SelectAndRank.build(method, spec.selector, str(tiny_model_dir), 32).save(selector)

    collection = Collection("toy", {"d1": Document("d1", "", "Cats purr. Dogs bark."), "d2": Document("d2", "", "Fish swim.")},
                            {"q1": "cats purr"}, {"train": {"q1": {"d1": 1}}})
    scorer = build_scorer(spec, collection, selector)
    assert scorer.name == method
    scores = scorer.scores("cats purr", ["Cats purr.", "Dogs bark."], random.Random(0))
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def _declarations():
    """(owner, declaration) of every loss and every weighting of the combination."""
    found = [(f"{kind} loss '{name}'", p) for kind, name in ALL_LOSSES
             for p in (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name].declared_parameters]
    return found + [(f"weighting '{w}'", p) for w, parameters in WEIGHTINGS.items() for p in parameters]


def test_a_field_several_losses_read_is_declared_alike():
    by_field: dict = {}
    for owner, parameter in _declarations():
        by_field.setdefault(parameter.field, []).append((owner, parameter))
    for field, owners in by_field.items():
        first_owner, first = owners[0]
        for owner, parameter in owners[1:]:
            assert parameter.compatible(first), f"'{field}': {first_owner} and {owner} declare it differently"
    # the shared ones (the constructor argument may differ: infonce's temperature is scl's tau)
    assert {o for o, _ in by_field["margin"]} >= {"ranking loss 'pairwise'", "ranking loss 'mhl'"}
    assert {o for o, _ in by_field["tau"]} >= {"contrastive loss 'scl'", "contrastive loss 'infonce'"}
    assert {o for o, _ in by_field["contrastive_margin"]} >= {"contrastive loss 'ctriplet'", "contrastive loss 'tml'"}


def test_declarations_that_disagree_are_refused():
    one = Parameter(field="x", annotation=float, default=1.0, gt=0, description="a number")
    assert collect_declarations({"a": (one,), "b": (one.taken_as("y"),)}) == {"x": one}  # another argument: fine
    for other in (Parameter(field="x", annotation=float, default=2.0, gt=0, description="a number"),
                  Parameter(field="x", annotation=int, default=1, gt=0, description="a number"),
                  Parameter(field="x", annotation=float, default=1.0, ge=0, description="a number")):
        with pytest.raises(TypeError, match="LossSpec field 'x' is declared differently by a and b"):
            collect_declarations({"a": (one,), "b": (other,)})


def test_hyperparameters_and_searchable_are_derived_never_declared():
    with pytest.raises(TypeError, match="derived"):
        type("Redeclared", (PairLoss,), {"name": "redeclared", "hyperparameters": {"margin": "margin"}})
    for _, name in ALL_LOSSES:
        cls = {**RANKING_LOSSES, **CONTRASTIVE_LOSSES}[name]
        assert cls.hyperparameters == {p.field: p.argument for p in cls.declared_parameters}
        assert cls.searchable == tuple(p.field for p in cls.declared_parameters if p.searchable)


def test_lossspec_fields_are_the_declarations():
    assert set(LOSS_HYPERPARAMETERS) == set(PARAMETERS)
    for owner, p in _declarations():
        info = LossSpec.model_fields[p.field]
        bounds = {k: getattr(m, k) for m in info.metadata for k in ("gt", "ge", "lt", "le") if hasattr(m, k)}
        assert (info.annotation, info.default, info.description, info.alias, bounds) == (
            p.annotation, p.default, p.description, p.alias, p.bounds), f"{owner}: {p.field}"
    # error messages name the field the YAML file uses
    with pytest.raises(ValueError, match="'lambda' has no effect with ranking 'pointwise', contrastive 'none'"):
        LossSpec.model_validate({"lambda": 0.3})
    with pytest.raises(ValueError, match="'lambdaloss_sigma' has no effect with ranking 'pointwise'"):
        LossSpec.model_validate({"lambdaloss_sigma": 2.0})
    assert LossSpec.model_validate({"ranking": "lambdaloss", "lambdaloss_sigma": 2.0}).lambdaloss_sigma == 2.0


@pytest.mark.parametrize("kind, name", ALL_LOSSES)
def test_constructor_defaults_are_the_declared_defaults(kind, name):
    cls = (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name]
    arguments = inspect.signature(cls.__init__).parameters
    for p in cls.declared_parameters:
        default = arguments[p.argument].default
        if default is None:  # a margin: the declared one (MarginPairLoss)
            default = cls.default_margin()
        assert default == p.default, f"{name}.__init__({p.argument}={default!r}) but {p.field} declares {p.default!r}"
        trial = {"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, "augmentation": {"method": "bm25"},
                 "loss": {kind: name, p.shown: p.keyed_default}}
        TrialSpec.model_validate(trial)  # its keyed default is a value the field accepts


def test_every_searchable_declaration_is_in_the_search_space():
    searchable = {f for f, p in PARAMETERS.items() if p.searchable}
    assert searchable >= {"margin", "lambda_", "tau", "contrastive_margin", "nca_scale", "lambdaloss_sigma"}
    assert searchable <= set(SearchSpec.model_fields)
    assert not ({f for f, p in PARAMETERS.items() if not p.searchable} & set(SearchSpec.model_fields))
    for field in searchable:
        assert SearchSpec.model_fields[field].alias == PARAMETERS[field].alias
    search = SearchSpec.model_validate({"lambda": {"low": 0.1, "high": 0.5}, "lambdaloss_sigma": {"choices": [0.5, 2.0]}})
    assert search.lambda_.low == 0.1 and search.lambdaloss_sigma.choices == [0.5, 2.0]


def test_supervised_scorers_are_exactly_the_selector_registry():
    """Supervised-ness is a property of the scorer; the selectors that train are the selector registry."""
    assert set(SUPERVISED_METHODS) == set(SELECTORS) == set(SELECTOR_METHODS) == {"linear", "attention"}
    assert all(not SCORERS[m].supervised for m in SCORERS if m not in SELECTORS)


def test_losses_that_need_augmentation_are_refused_without_it_in_trials_and_grids():
    needing = [(kind, name) for kind, name in ALL_LOSSES
               if (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name].needs_augmentation]
    assert ("contrastive", "infonce") in needing
    for kind, name in needing:
        loss = {kind: name}
        assert needs_augmentation(LossSpec.model_validate(loss))
        with pytest.raises(ValueError, match="contrasts a relevant pair with its augmented view"):
            TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, "loss": loss})


# ----------------------------------------------------------------------------- trial kinds


def _kind_examples():
    rerank = TrialSpec.model_validate({"name": "t", "data": {"collection": "beir/scifact"}, "model": {"name": "m"},
                                       "augmentation": {"method": "linear"}})

    ear = EarTrialSpec.model_validate({"kind": "ear", "name": "e", "data": {"collection": "beir/scifact"}, "model": {"name": "m"}})
    dense = DenseTrialSpec.model_validate({"kind": "dense", "name": "d", "data": {"collection": "beir/scifact"}, "model": {"name": "m"}})
    return {"rerank": rerank, "selector": selector_trial(rerank), "ear": ear, "dense": dense}


@pytest.mark.parametrize("name", sorted(TRIAL_KINDS))
def test_every_trial_kind_names_its_whole_lifecycle(name):
    """A kind is one registration: a typed spec, its workers' inputs, and every step of its
    lifecycle; a required trial has a kind of its own and an identity to be shared by."""

    kind = TRIAL_KINDS[name]
    example = _kind_examples()[name]
    assert issubclass(kind.spec, BaseModel) and dataclasses.is_dataclass(kind.inputs)
    assert kind_of(example) is kind
    for step in (kind.requires, kind.prepare, kind.worker_inputs, kind.train, kind.test, kind.finished, kind.keep):
        assert callable(step)
    # the orchestrator calls these steps in Ray tasks and workers with the device they run on
    inspect.signature(kind.test).bind("checkpoint", "prepared", example, {}, device=torch.device("cpu"))
    inspect.signature(kind.train).bind(example, "inputs", lambda metrics, checkpoint: None, device=torch.device("cpu"),
                                       resume_from=None)
    inspect.signature(kind.keep).bind(example, "checkpoint", {}, device=torch.device("cpu"))
    assert kind.epochs(example) >= 1  # a sweep's pruner counts a trial's epochs against it
    assert kind.state_file.endswith(".pt")  # left out of every model logged to MLflow
    for required in kind.requires(example):
        required_kind = kind_of(required)
        assert required_kind.key is not None, f"{required_kind.name} is required but has no identity to share"
        assert required_kind.key(required) == required_kind.key(required.model_copy())
    assert len(requirements([example, example])) == len(kind.requires(example))  # shared: each once
