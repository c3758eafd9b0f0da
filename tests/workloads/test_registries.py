"""Contract tests over the registries (as Optuna tests every sampler): every loss and every
augmentation scorer is configurable from YAML, constructible from its spec, and every
hyper-parameter a loss declares searchable can be searched by a sweep."""

import inspect
import random

import pytest
import torch

from workloads.augmentation.scorers import SCORERS
from workloads.batches import triples_to_batch
from workloads.losses import CONTRASTIVE_LOSSES, RANKING_LOSSES, ModelOutputs, build_loss
from workloads.spec import AugmentationSpec, LossSpec, TrialSpec

ROWS = [{"query_id": q, "query": f"query {q}", "positive": f"relevant {q}", "negative": f"other {q}",
         "augmented_positive": f"part of relevant {q}", "augmented_negative": f"random {q}"} for q in ("a", "a", "b")]
ALL_LOSSES = [("ranking", name) for name in RANKING_LOSSES] + [("contrastive", name) for name in CONTRASTIVE_LOSSES]


def spec_for(kind: str, name: str) -> LossSpec:
    return LossSpec(ranking=name) if kind == "ranking" else LossSpec(contrastive=name)


@pytest.mark.parametrize("kind, name", ALL_LOSSES)
def test_every_loss_is_configurable(kind, name, tmp_path):
    from orchestrator.core.config import load_spec

    trial = {"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, "loss": {kind: name},
             "augmentation": {"method": "bm25"}}
    path = tmp_path / "trial.yaml"
    import yaml

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
    from orchestrator.sweep.grid import Cell, SearchSpec
    from orchestrator.sweep.search import apply_params

    cls = (RANKING_LOSSES if kind == "ranking" else CONTRASTIVE_LOSSES)[name]
    spec = TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"},
                                     "loss": {kind: name}, "augmentation": {"method": "bm25"}})
    cell = Cell("cell-0", {}, spec, None, False)
    for field in cls.searchable:
        assert field in cell.searched
        alias = SearchSpec.model_fields[field].alias or field
        assert alias in SearchSpec.model_fields or field in SearchSpec.model_fields  # a sweep file can give it a range
        default = LossSpec.model_fields[field].default
        changed = apply_params(spec, {field: default * 1.5})
        assert getattr(changed.loss, field) == pytest.approx(default * 1.5)


@pytest.mark.parametrize("method", sorted(SCORERS))
def test_every_augmentation_scorer_is_configurable_and_constructible(method, tmp_path, tiny_model_dir):
    glove = tmp_path / "glove.txt"
    glove.write_text("cats 1 0\npurr 0 1\n")
    spec = AugmentationSpec(method=method, glove_path=str(glove) if method == "glove" else None)
    from workloads.augmentation import build_scorer
    from workloads.augmentation.scorers import SUPERVISED_METHODS

    selector = None
    if method in SUPERVISED_METHODS:  # a supervised scorer reads a trained selector's directory
        from workloads.selectors.select_and_rank import SelectAndRank

        selector = tmp_path / "selector"
        SelectAndRank.build(method, spec.selector, str(tiny_model_dir), 32).save(selector)
    sentences = {"d1": ["Cats purr.", "Dogs bark."], "d2": ["Fish swim."]}
    scorer = build_scorer(spec, sentences, selector)
    assert scorer.name == method
    scores = scorer.scores("cats purr", sentences["d1"], random.Random(0))
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
