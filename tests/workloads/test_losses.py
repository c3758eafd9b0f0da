"""Each ranking loss against a value computed by hand, plus degenerate batches."""

import math

import pytest
import torch

from workloads.batches import PairStructure
from workloads.losses import RANKING_LOSSES, ModelOutputs, build_ranking_loss


def structure(labels, query_ids, triple_ids):
    n = len(labels)
    return PairStructure(torch.tensor(labels, dtype=torch.float), torch.tensor(query_ids), torch.tensor(triple_ids),
                         torch.zeros(n, dtype=torch.bool), torch.full((n,), -1))


def outputs(scores):
    s = torch.tensor(scores, requires_grad=True)
    return ModelOutputs(s, torch.zeros(len(scores), 4))


# Two queries; query 0 has two triples, query 1 one triple. Pairs: (pos, neg) per triple.
SCORES = [2.0, 0.5, 0.0, 1.0, 1.5, -1.0]
STRUCT = structure([1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2])


def sig(x):
    return 1 / (1 + math.exp(-x))


def test_pointwise_bce_hand_value():
    expected = -(math.log(sig(2.0)) + math.log(1 - sig(0.5)) + math.log(sig(0.0)) + math.log(1 - sig(1.0))
                 + math.log(sig(1.5)) + math.log(1 - sig(-1.0))) / 6
    assert build_ranking_loss("pointwise")(outputs(SCORES), STRUCT).item() == pytest.approx(expected, rel=1e-6)


def test_pairwise_hinge_hand_value():
    # triples: max(0, 1 - 2 + 0.5) = 0, max(0, 1 - 0 + 1) = 2, max(0, 1 - 1.5 - 1) = 0 -> mean 2/3
    assert build_ranking_loss("pairwise", margin=1.0)(outputs(SCORES), STRUCT).item() == pytest.approx(2 / 3)


def test_pairwise_margin_matters():
    # margin 3: max(0, 3-2+.5)=1.5, max(0, 3-0+1)=4, max(0, 3-1.5-1)=.5 -> 2.0
    assert build_ranking_loss("pairwise", margin=3.0)(outputs(SCORES), STRUCT).item() == pytest.approx(2.0)


def test_mhl_uses_hardest_negative_of_same_query():
    # query 0: negatives 0.5 and 1.0 -> hardest 1.0; positives 2.0 -> max(0,1-2+1)=0, 0.0 -> max(0,1-0+1)=2
    # query 1: positive 1.5, negative -1 -> 0.  mean over 3 positives = 2/3 ... but with hardest, not own:
    assert build_ranking_loss("mhl", margin=1.0)(outputs(SCORES), STRUCT).item() == pytest.approx(2 / 3)
    # with margin 1.5: q0: max(0,1.5-2+1)=.5, max(0,1.5-0+1)=2.5; q1: max(0,1.5-1.5-1)=0 -> 1.0
    assert build_ranking_loss("mhl", margin=1.5)(outputs(SCORES), STRUCT).item() == pytest.approx(1.0)
    # pairwise would use the own-triple negative: (0 + 1.5 - 2 + 0.5 -> 0) differs on the first positive
    assert build_ranking_loss("pairwise", margin=1.5)(outputs(SCORES), STRUCT).item() == pytest.approx((0 + 2.5 + 0) / 3)


@pytest.mark.parametrize("name", sorted(RANKING_LOSSES))
def test_degenerate_batch_is_finite_and_counted(name):
    only_positives = structure([1, 1], [0, 1], [0, 1])
    loss_fn = build_ranking_loss(name)
    out = outputs([0.3, -0.2])
    value = loss_fn(out, only_positives)
    assert torch.isfinite(value)
    value.backward()
    assert torch.isfinite(out.scores.grad).all()
    if name != "pointwise":  # pointwise has something to learn from any labelled pair
        assert value.item() == 0.0 and loss_fn.degenerate_batches == 1


@pytest.mark.parametrize("name", sorted(RANKING_LOSSES))
def test_gradient_pushes_positive_up(name):
    out = outputs(SCORES)
    margin = {"margin": 5.0} if "margin" in RANKING_LOSSES[name].hyperparameters else {}  # what the loss declares
    build_ranking_loss(name, **margin)(out, STRUCT).backward()
    grad = out.scores.grad
    assert grad[2] < 0 and grad[3] > 0  # descending the loss raises a positive and lowers a negative


def test_unknown_loss_is_an_error():
    with pytest.raises(ValueError, match="unknown ranking loss 'listnet'"):
        build_ranking_loss("listnet")
