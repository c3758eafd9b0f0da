"""Each ranking loss against a value computed by hand, plus degenerate batches."""

import dataclasses
import math

import pytest
import torch

from workloads.losses import RANKING_LOSSES, ModelOutputs, build_ranking_loss
from workloads.losses.base import PairStructure


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
    taught = dataclasses.replace(STRUCT, teacher=torch.tensor([4.0, 0.0] * 3))  # a teacher's scores: margin_mse's targets
    build_ranking_loss(name, **margin)(out, taught).backward()
    grad = out.scores.grad
    assert grad[2] < 0 and grad[3] > 0  # descending the loss raises a positive and lowers a negative


def test_unknown_loss_is_an_error():
    with pytest.raises(ValueError, match="unknown ranking loss 'listnet'"):
        build_ranking_loss("listnet")


# LambdaLoss (NDCG-Loss2++) over one block: positive first, then its negatives.
def lambdaloss_by_hand(positive, negatives, sigma=1.0, mu=10.0):
    """The paper's pair weights on the ranking by score, each pair -w log2 sigmoid(sigma (s+ - s-)), mean over pairs."""
    ranked = sorted([positive, *negatives], reverse=True)
    rank_pos = ranked.index(positive) + 1
    inv_d = lambda r: 1 / math.log2(1 + r)  # noqa: E731
    total = 0.0
    for s in negatives:
        rank_neg = ranked.index(s) + 1
        distance = abs(rank_pos - rank_neg)
        w = mu * abs(inv_d(distance) - inv_d(distance + 1)) + abs(inv_d(rank_pos) - inv_d(rank_neg))
        total += -w * math.log2(sig(sigma * (positive - s)))
    return total / len(negatives)


ONE_BLOCK = structure([1, 0, 0], [0, 0, 0], [0, 0, 0])


def test_lambdaloss_hand_value():
    # ranking by score: the negative 1.0 (rank 1), the positive 0.5 (rank 2), the negative -0.2 (rank 3);
    # D(r) = log2(1 + r): D(1) = 1, D(2) = log2 3, D(3) = 2; both pairs are one rank apart
    d1, d2, d3 = 1.0, math.log2(3), 2.0
    w_first = 10 * (1 / d1 - 1 / d2) + (1 / d1 - 1 / d2)  # NDCG-Loss2 (distance 1) x mu + LambdaRank (ranks 2, 1)
    w_last = 10 * (1 / d1 - 1 / d2) + (1 / d2 - 1 / d3)   # NDCG-Loss2 (distance 1) x mu + LambdaRank (ranks 2, 3)
    expected = (-w_first * math.log2(sig(0.5 - 1.0)) - w_last * math.log2(sig(0.5 + 0.2))) / 2
    assert expected == pytest.approx(lambdaloss_by_hand(0.5, [1.0, -0.2]))
    value = build_ranking_loss("lambdaloss")(outputs([0.5, 1.0, -0.2]), ONE_BLOCK).item()
    assert value == pytest.approx(expected, abs=1e-6)
    # sigma and mu as declared: sigma scales the score differences, mu the NDCG-Loss2 term
    loss = build_ranking_loss("lambdaloss", lambdaloss_sigma=2.0, lambdaloss_mu=5.0)
    assert loss.config == {"sigma": 2.0, "mu": 5.0}
    assert loss(outputs([0.5, 1.0, -0.2]), ONE_BLOCK).item() == pytest.approx(
        lambdaloss_by_hand(0.5, [1.0, -0.2], sigma=2.0, mu=5.0), abs=1e-6)


def test_lambdaloss_is_a_mean_over_blocks():
    # the pairs of the batch's three triples are three blocks of one pair each
    loss = build_ranking_loss("lambdaloss")(outputs(SCORES), STRUCT).item()
    by_hand = [lambdaloss_by_hand(SCORES[i], [SCORES[i + 1]]) for i in (0, 2, 4)]
    assert loss == pytest.approx(sum(by_hand) / 3, abs=1e-6)


def test_lambdaloss_decreases_as_the_positive_rises():
    """Its weights follow the ranking (they change where the positive passes a negative), so
    the loss falls as the positive's score rises within each ranking, its gradient always
    pushes the positive up, and a positive on top costs less than one at the bottom."""
    loss = build_ranking_loss("lambdaloss")
    block = structure([1, 0, 0, 0], [0] * 4, [0] * 4)
    negatives = [0.3, -0.1, 1.1]

    def value(positive):
        out = outputs([positive, *negatives])
        result = loss(out, block)
        result.backward()
        assert out.scores.grad[0] < 0 and (out.scores.grad[1:] > 0).all()
        return result.item()

    for low, high in ((-2.0, -0.2), (0.0, 0.25), (0.35, 1.0), (1.2, 3.0)):  # ranks 4, 3, 2, 1 of the positive
        values = [value(low + (high - low) * i / 4) for i in range(5)]
        assert all(a > b for a, b in zip(values, values[1:])), values
        assert values[0] == pytest.approx(lambdaloss_by_hand(low, negatives), abs=1e-6)
    assert value(3.0) < value(-2.0)


def test_lambdaloss_block_without_negative_compares_nothing():
    loss = build_ranking_loss("lambdaloss")
    # a block of a positive alone: a zero that keeps the graph, counted as degenerate
    out = outputs([0.4])
    value = loss(out, structure([1], [0], [0]))
    value.backward()
    assert value.item() == 0.0 and loss.degenerate_batches == 1
    assert out.scores.grad is not None and out.scores.grad.abs().sum() == 0
    # beside a block that has a negative, it adds nothing
    mixed = loss(outputs([0.5, 1.0, -0.2, 0.4]), structure([1, 0, 0, 1], [0, 0, 0, 1], [0, 0, 0, 1])).item()
    assert mixed == pytest.approx(lambdaloss_by_hand(0.5, [1.0, -0.2]), abs=1e-6)
    assert loss.degenerate_batches == 1
