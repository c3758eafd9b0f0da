"""Contrastive losses against hand-written formulas on a 6-pair batch with augmented pairs,
degenerate batches, the combination weights, and gradients reaching the encoder."""

import math

import pytest
import torch

from workloads.batches import PairStructure, triples_to_batch
from workloads.losses import CONTRASTIVE_LOSSES, ModelOutputs, RankingWithContrastive, build_contrastive_loss, build_ranking_loss

# Pairs: 0 (q0, d+), 1 (q0, d-), 2 (q1, d+), 3 (q1, d-), 4 (q0, d+_a made from pair 0), 5 (q0, d-_a)
ANGLES = [0, 90, 30, 180, 10, 120]  # Phi_i = unit vector at this angle (degrees): Phi_i . Phi_j = cos(difference)
LABELS = [1, 0, 1, 0, 1, 0]
QUERIES = [0, 0, 1, 1, 0, 0]
STRUCT = PairStructure(torch.tensor(LABELS, dtype=torch.float), torch.tensor(QUERIES), torch.tensor([0, 0, 1, 1, 2, 2]),
                       torch.tensor([False, False, False, False, True, True]), torch.tensor([-1, -1, -1, -1, 0, -1]))


def phi(scale=3.0):
    # scaled on purpose: every loss normalises Phi first
    return torch.tensor([[scale * math.cos(math.radians(a)), scale * math.sin(math.radians(a))] for a in ANGLES],
                        requires_grad=True)


def outputs():
    return ModelOutputs(torch.zeros(6), phi())


def cos(i, j):
    return math.cos(math.radians(ANGLES[i] - ANGLES[j]))


def sqdist(i, j):
    return 2 - 2 * cos(i, j)  # unit vectors


def log_softmax_term(i, j, sim, temperature=1.0):
    denominator = sum(math.exp(sim(i, k) / temperature) for k in range(6) if k != i)
    return sim(i, j) / temperature - math.log(denominator)


def test_scl_hand_value():
    tau = 0.5
    # anchors: 0 (positives {4}) and 4 (positives {0}); 2 has no other relevant pair of q1
    expected = -(log_softmax_term(0, 4, cos, tau) + log_softmax_term(4, 0, cos, tau)) / 2
    assert build_contrastive_loss("scl", tau=tau)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_ctriplet_hand_value():
    alpha = 0.5
    vec = {i: (math.cos(math.radians(a)), math.sin(math.radians(a))) for i, a in enumerate(ANGLES)}
    mean = lambda ids: tuple(sum(vec[i][d] for i in ids) / len(ids) for d in (0, 1))  # noqa: E731
    sq = lambda v, c: (v[0] - c[0]) ** 2 + (v[1] - c[1]) ** 2  # noqa: E731
    terms = []
    for pos_ids, neg_ids in (([0, 4], [1, 5]), ([2], [3])):
        c_p, c_n = mean(pos_ids), mean(neg_ids)
        terms += [max(0.0, sq(vec[i], c_p) - sq(vec[i], c_n) + alpha) for i in pos_ids]
        terms += [max(0.0, sq(vec[i], c_n) - sq(vec[i], c_p) + alpha) for i in neg_ids]
    expected = sum(terms) / len(terms)
    assert build_contrastive_loss("ctriplet", margin=alpha)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_infonce_hand_value():
    t = 0.1
    expected = -log_softmax_term(0, 4, cos, t)  # anchor 0, its augmented view 4, all others negatives
    assert build_contrastive_loss("infonce", tau=t)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_nca_identity_hand_value():
    neg_sq = lambda i, j: -sqdist(i, j)  # noqa: E731
    expected = -(log_softmax_term(0, 4, neg_sq) + log_softmax_term(4, 0, neg_sq)) / 2
    assert build_contrastive_loss("nca")(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_nca_learned_map_starts_at_identity_and_learns():
    loss = build_contrastive_loss("nca", learned_map=True, hidden_size=2)
    assert loss(outputs(), STRUCT).item() == pytest.approx(build_contrastive_loss("nca")(outputs(), STRUCT).item(), rel=1e-6)
    loss(outputs(), STRUCT).backward()
    assert loss.map.weight.grad is not None and loss.map.weight.grad.abs().sum() > 0


def test_tml_hand_value():
    m = 0.5
    d = lambda i, j: math.sqrt(sqdist(i, j))  # noqa: E731
    triplets = [(0, 2, 1), (0, 2, 5), (4, 2, 1), (4, 2, 5), (2, 0, 3), (2, 4, 3)]  # (a, k+ other query, k- same query)
    expected = sum(max(0.0, m + d(a, p) - d(a, n)) for a, p, n in triplets) / len(triplets)
    assert build_contrastive_loss("tml", margin=m)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("name", sorted(CONTRASTIVE_LOSSES))
def test_degenerate_batches_are_finite_zero_and_counted(name):
    # one relevant pair per query, no augmentation, identical vectors: nothing to contrast for any loss
    structure = PairStructure(torch.tensor([1.0, 1.0]), torch.tensor([0, 1]), torch.tensor([0, 1]),
                              torch.tensor([False, False]), torch.tensor([-1, -1]))
    vectors = torch.ones(2, 4, requires_grad=True)
    loss_fn = build_contrastive_loss(name, hidden_size=4)
    value = loss_fn(ModelOutputs(torch.zeros(2), vectors), structure)
    value.backward()
    assert value.item() == 0.0 and loss_fn.degenerate_batches == 1
    assert torch.isfinite(vectors.grad).all()


@pytest.mark.parametrize("name", sorted(CONTRASTIVE_LOSSES))
def test_identical_vectors_give_finite_gradients(name):
    vectors = torch.ones(6, 3, requires_grad=True)
    build_contrastive_loss(name, hidden_size=3)(ModelOutputs(torch.zeros(6), vectors), STRUCT).backward()
    assert torch.isfinite(vectors.grad).all()


def test_combination_weights():
    ranking, contrastive = build_ranking_loss("pointwise"), build_contrastive_loss("scl")
    out = ModelOutputs(torch.tensor([1.0, -1.0, 0.5, 0.0, 2.0, 0.0]), phi())
    r, c = ranking(out, STRUCT).item(), contrastive(out, STRUCT).item()
    fixed = RankingWithContrastive(ranking, contrastive, "fixed", lambda_=0.3)
    assert fixed(out, STRUCT).item() == pytest.approx(0.7 * r + 0.3 * c, rel=1e-6)
    assert fixed.last_parts == pytest.approx({"ranking": r, "contrastive": c}, rel=1e-6)
    equal = RankingWithContrastive(ranking, contrastive, "equal")
    assert equal(out, STRUCT).item() == pytest.approx(0.5 * r + 0.5 * c, rel=1e-6)
    dwa = RankingWithContrastive(ranking, contrastive, "dwa", period=8)
    values = [dwa(out, STRUCT).item() for _ in range(3)]  # steps 0, 1, 2
    for t, value in enumerate(values):
        w1 = abs(math.sin(2 * math.pi * t / 8))
        assert value == pytest.approx(w1 * r + (1 - w1) * c, rel=1e-6)


def test_batch_structure_of_augmented_triples():
    rows = [
        {"query_id": "a", "query": "qa", "positive": "p1", "negative": "n1", "augmented_positive": "p1a", "augmented_negative": "x"},
        {"query_id": "b", "query": "qb", "positive": "p2", "negative": "n2", "augmented_positive": "p2a", "augmented_negative": "y"},
    ]
    batch = triples_to_batch(rows)
    s = batch.structure
    assert batch.documents == ["p1", "n1", "p2", "n2", "p1a", "x", "p2a", "y"]  # the batch doubles
    assert s.labels.tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert s.query_ids.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert s.augmented.tolist() == [False] * 4 + [True] * 4
    assert s.source.tolist() == [-1, -1, -1, -1, 0, -1, 2, -1]
    assert s.triple_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("name", sorted(CONTRASTIVE_LOSSES))
def test_gradient_reaches_the_encoder(name, tiny_model_dir):
    from workloads.models.cross_encoder import CrossEncoder

    torch.manual_seed(0)
    model = CrossEncoder.from_pretrained(str(tiny_model_dir), max_length=32)
    rows = [
        {"query_id": "a", "query": "what purrs", "positive": "cats purr when happy", "negative": "dogs bark at night",
         "augmented_positive": "cats purr", "augmented_negative": "the stock market fell"},
        {"query_id": "b", "query": "why is the sky blue", "positive": "rayleigh scattering makes the sky blue",
         "negative": "grass is green", "augmented_positive": "the sky is blue", "augmented_negative": "pasta recipes"},
    ]
    batch = triples_to_batch(rows)
    layer = model.encoder.encoder.layer[0].attention.self.query.weight
    before = layer.detach().clone()
    loss_fn = build_contrastive_loss(name, hidden_size=model.encoder.config.hidden_size)
    optimizer = torch.optim.SGD([*model.parameters(), *loss_fn.parameters()], lr=1.0)
    scores, representations = model(**model.encode(batch.queries, batch.documents).inputs)
    loss = loss_fn(ModelOutputs(scores, representations), batch.structure)
    assert loss.item() > 0
    loss.backward()
    assert model.score_head.weight.grad is None or model.score_head.weight.grad.abs().sum() == 0  # Phi only
    optimizer.step()
    assert not torch.equal(before, layer.detach())
