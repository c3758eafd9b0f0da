"""Contrastive losses against hand-written formulas on a 6-pair batch with augmented pairs,
degenerate batches, the combination weights, and gradients reaching the encoder."""

import math

import pytest
import torch

from workloads.kinds.rerank.batching import triples_to_batch
from workloads.losses import CONTRASTIVE_LOSSES, ModelOutputs, RankingWithContrastive, build_contrastive_loss, build_ranking_loss
from workloads.losses.base import PairStructure
from workloads.models.cross_encoder import CrossEncoder
from workloads.training import load_loss_state

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
    loss = build_contrastive_loss("ctriplet", contrastive_margin=alpha, ctriplet_centroid="inclusive")
    assert loss(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_infonce_hand_value():
    t = 0.1
    expected = -log_softmax_term(0, 4, cos, t)  # anchor 0, its augmented view 4, all others negatives
    assert build_contrastive_loss("infonce", tau=t)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_nca_identity_hand_value():
    neg_sq = lambda i, j: -sqdist(i, j)  # noqa: E731
    expected = -(log_softmax_term(0, 4, neg_sq) + log_softmax_term(4, 0, neg_sq)) / 2
    assert build_contrastive_loss("nca", nca_map="identity")(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


def test_nca_learned_map_starts_at_identity_and_learns():
    loss = build_contrastive_loss("nca", hidden_size=2, nca_map="learned")
    identity = build_contrastive_loss("nca", nca_map="identity")
    assert loss(outputs(), STRUCT).item() == pytest.approx(identity(outputs(), STRUCT).item(), rel=1e-6)
    loss(outputs(), STRUCT).backward()
    assert loss.map.weight.grad is not None and loss.map.weight.grad.abs().sum() > 0


def test_tml_hand_value():
    m = 0.5
    d = lambda i, j: math.sqrt(sqdist(i, j))  # noqa: E731
    triplets = [(0, 2, 1), (0, 2, 5), (4, 2, 1), (4, 2, 5), (2, 0, 3), (2, 4, 3)]  # (a, k+ other query, k- same query)
    expected = sum(max(0.0, m + d(a, p) - d(a, n)) for a, p, n in triplets) / len(triplets)
    assert build_contrastive_loss("tml", contrastive_margin=m)(outputs(), STRUCT).item() == pytest.approx(expected, rel=1e-5)


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


# ----------------------------------------------------------------------------- readings (audit items 5-8)


def test_ctriplet_hand_values_where_the_hinge_is_positive():
    # alpha = 3.0 on the suite's batch: every term is positive (independent value 0.493598, inclusive centroids)
    inclusive = build_contrastive_loss("ctriplet", contrastive_margin=3.0, ctriplet_centroid="inclusive")
    assert inclusive(outputs(), STRUCT).item() == pytest.approx(0.493598, abs=1e-6)
    assert inclusive.degenerate_batches == 0
    # leave-one-out: only pairs whose class has another member (q0: 0 and 4 relevant, 1 and 5 not);
    # q1's classes have one member each and contribute nothing
    vec = {i: (math.cos(math.radians(a)), math.sin(math.radians(a))) for i, a in enumerate(ANGLES)}
    sq = lambda v, c: (v[0] - c[0]) ** 2 + (v[1] - c[1]) ** 2  # noqa: E731
    mean = lambda ids: tuple(sum(vec[i][d] for i in ids) / len(ids) for d in (0, 1))  # noqa: E731
    alpha = 3.0
    terms = [max(0.0, sq(vec[i], vec[own]) - sq(vec[i], mean(other)) + alpha)
             for i, own, other in ((0, 4, [1, 5]), (4, 0, [1, 5]), (1, 5, [0, 4]), (5, 1, [0, 4]))]
    leave_one_out = build_contrastive_loss("ctriplet", contrastive_margin=alpha)  # the default
    assert leave_one_out(outputs(), STRUCT).item() == pytest.approx(sum(terms) / 4, rel=1e-5)
    assert leave_one_out.degenerate_batches == 0
    assert sum(terms) / 4 != pytest.approx(0.493598, abs=1e-3)  # the two readings differ


def test_ctriplet_leave_one_out_has_nothing_for_one_member_classes():
    one_triple = PairStructure(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([0, 0]),
                               torch.tensor([False, False]), torch.tensor([-1, -1]))
    loss = build_contrastive_loss("ctriplet")
    assert loss(ModelOutputs(torch.zeros(2), torch.eye(2, requires_grad=True)), one_triple).item() == 0.0
    assert loss.degenerate_batches == 1
    inclusive = build_contrastive_loss("ctriplet", ctriplet_centroid="inclusive")  # distance 0 to itself: a pure push
    assert inclusive(ModelOutputs(torch.zeros(2), torch.eye(2)), one_triple).item() == pytest.approx(max(0.0, 0 - 2 + 0.5))


def test_tml_hand_values_where_the_hinge_is_positive():
    m = 2.0
    d = lambda i, j: math.sqrt(sqdist(i, j))  # noqa: E731
    triplets = [(0, 2, 1), (0, 2, 5), (4, 2, 1), (4, 2, 5), (2, 0, 3), (2, 4, 3)]
    terms = [max(0.0, m + d(a, p) - d(a, n)) for a, p, n in triplets]
    loss = build_contrastive_loss("tml", contrastive_margin=m)
    assert loss(outputs(), STRUCT).item() == pytest.approx(0.776826, abs=1e-6)  # independent value
    assert loss(outputs(), STRUCT).item() == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    assert loss.degenerate_batches == 0
    # CFT's library: the mean over non-zero terms only (at m = 1.2 some terms are 0, some not)
    terms = [max(0.0, 1.2 + d(a, p) - d(a, n)) for a, p, n in triplets]
    nonzero = [t for t in terms if t > 0]
    assert 0 < len(nonzero) < len(terms)
    value = build_contrastive_loss("tml", contrastive_margin=1.2, tml_reduction="nonzero")(outputs(), STRUCT).item()
    assert value == pytest.approx(sum(nonzero) / len(nonzero), rel=1e-5)
    plain = build_contrastive_loss("tml", contrastive_margin=1.2)(outputs(), STRUCT).item()
    assert plain == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_scl_normalisations_per_anchor_and_global():
    tau = 0.5
    pair_terms = -log_softmax_term(0, 4, cos, tau) - log_softmax_term(4, 0, cos, tau)
    per_anchor = build_contrastive_loss("scl", tau=tau)(outputs(), STRUCT).item()
    global_ = build_contrastive_loss("scl", tau=tau, scl_normalization="global")(outputs(), STRUCT).item()
    assert per_anchor == pytest.approx(0.7406, abs=1e-4) and per_anchor == pytest.approx(pair_terms / 2, rel=1e-5)
    # AUG eq. 17 as printed: one 1/N+ with N+ = 3 relevant pairs (pair 2 has no positive but counts)
    assert global_ == pytest.approx(0.4937, abs=1e-4) and global_ == pytest.approx(pair_terms / 3, rel=1e-5)


# Two triples of one query, both augmented, plus a triple of another query: several positives per anchor.
# Pairs: 0 (q0 d+1), 1 (q0 d-1), 2 (q0 d+2), 3 (q0 d-2), 4 (q1 d+), 5 (q1 d-),
#        6 (q0 d+1_a from 0), 7 (q0 d-1_a), 8 (q0 d+2_a from 2), 9 (q0 d-2_a)
MULTI_ANGLES = [0, 100, 40, 200, 150, 250, 15, 300, 60, 170]
MULTI = PairStructure(torch.tensor([1, 0, 1, 0, 1, 0, 1, 0, 1, 0], dtype=torch.float),
                      torch.tensor([0, 0, 0, 0, 1, 1, 0, 0, 0, 0]), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4]),
                      torch.tensor([False] * 6 + [True] * 4), torch.tensor([-1, -1, -1, -1, -1, -1, 0, -1, 2, -1]))


def multi_cos(i, j):
    return math.cos(math.radians(MULTI_ANGLES[i] - MULTI_ANGLES[j]))


def multi_outputs():
    return ModelOutputs(torch.zeros(10), torch.tensor([[2 * math.cos(math.radians(a)), 2 * math.sin(math.radians(a))]
                                                       for a in MULTI_ANGLES], requires_grad=True))


def multi_log_p(i, j, sim):
    return sim(i, j) - math.log(sum(math.exp(sim(i, k)) for k in range(10) if k != i))


def test_scl_nca_infonce_with_several_positives_per_anchor():
    relevant_q0 = [0, 2, 6, 8]
    # SCL, tau 0.3: mean over the 4 anchors of the mean over their 3 positives
    scl_sim = lambda i, j: multi_cos(i, j) / 0.3  # noqa: E731
    scl = sum(-sum(multi_log_p(i, j, scl_sim) for j in relevant_q0 if j != i) / 3 for i in relevant_q0) / 4
    assert build_contrastive_loss("scl", tau=0.3)(multi_outputs(), MULTI).item() == pytest.approx(scl, rel=1e-5)
    # NCA (identity, s = 1): the log of the summed neighbour probability, not a mean of logs
    nca_sim = lambda i, j: -(2 - 2 * multi_cos(i, j))  # noqa: E731
    nca = sum(-math.log(sum(math.exp(multi_log_p(i, j, nca_sim)) for j in relevant_q0 if j != i)) for i in relevant_q0) / 4
    mean_of_logs = sum(-sum(multi_log_p(i, j, nca_sim) for j in relevant_q0 if j != i) / 3 for i in relevant_q0) / 4
    value = build_contrastive_loss("nca", nca_map="identity")(multi_outputs(), MULTI).item()
    assert value == pytest.approx(nca, rel=1e-5) and abs(value - mean_of_logs) > 0.5
    # InfoNCE, t 0.1: anchors 0 and 2, each with its own augmented view (6 and 8)
    nce_sim = lambda i, j: multi_cos(i, j) / 0.1  # noqa: E731
    infonce = -(multi_log_p(0, 6, nce_sim) + multi_log_p(2, 8, nce_sim)) / 2
    assert build_contrastive_loss("infonce", tau=0.1)(multi_outputs(), MULTI).item() == pytest.approx(infonce, rel=1e-5)


def test_identity_nca_is_scl_at_half_its_scale_with_one_positive_per_anchor():
    for scale in (0.4, 1.0, 2.0):
        nca = build_contrastive_loss("nca", nca_map="identity", nca_scale=scale)(outputs(), STRUCT).item()
        assert nca == pytest.approx(build_contrastive_loss("scl", tau=scale / 2)(outputs(), STRUCT).item(), rel=1e-5)
    # with several positives per anchor they differ (log of a sum vs a mean of logs)
    nca = build_contrastive_loss("nca", nca_map="identity")(multi_outputs(), MULTI).item()
    assert nca != pytest.approx(build_contrastive_loss("scl", tau=0.5)(multi_outputs(), MULTI).item(), rel=1e-2)
    # the scale changes the value
    assert build_contrastive_loss("nca", nca_map="identity", nca_scale=0.3)(outputs(), STRUCT).item() != pytest.approx(
        build_contrastive_loss("nca", nca_map="identity")(outputs(), STRUCT).item(), rel=1e-3)


def test_dwa_step_and_degenerate_counts_survive_a_checkpoint():
    def fresh():
        return RankingWithContrastive(build_ranking_loss("pointwise"), build_contrastive_loss("scl"), "dwa", period=8)

    loss = fresh()
    for _ in range(5):
        loss(ModelOutputs(torch.zeros(6), phi()), STRUCT)
    loss(ModelOutputs(torch.zeros(2), torch.ones(2, 2)), PairStructure(torch.tensor([1.0, 1.0]), torch.tensor([0, 1]),
                                                                         torch.tensor([0, 1]), torch.zeros(2, dtype=torch.bool),
                                                                         torch.tensor([-1, -1])))
    assert loss.step == 6 and loss.degenerate_batches == 1
    restored = fresh()
    load_loss_state(restored, loss.state_dict())  # what a resumed trial does with its checkpoint
    assert restored.step == 6 and restored.degenerate_batches == 1
    assert restored.weights() == pytest.approx(loss.weights())
    assert restored.weights()[0] == pytest.approx(abs(math.sin(2 * math.pi * 6 / 8)))  # not t = 0's (0, 1)
    # a checkpoint written before the counters were saved still loads (counters start at 0)
    legacy = {k: v for k, v in loss.state_dict().items() if not k.endswith("_extra_state")}
    older = fresh()
    load_loss_state(older, legacy)
    assert older.step == 0


def test_tml_anchors_all_forms_every_label_defined_triplet():
    """CFT's library (pytorch-metric-learning) knows labels only: every (a, k+ != a with a's
    label, k- with the other label), non-relevant anchors included, queries ignored."""
    m = 1.2
    d = lambda i, j: math.sqrt(sqdist(i, j))  # noqa: E731
    relevant, other = [0, 2, 4], [1, 3, 5]
    triplets = [(a, p, n) for group, rest in ((relevant, other), (other, relevant)) for a in group for p in group if p != a
                for n in rest]
    assert len(triplets) == 2 * 3 * 2 * 3  # 36 here, against the 6 of CFT eq. 3 ("positives")
    terms = [max(0.0, m + d(a, p) - d(a, n)) for a, p, n in triplets]
    value = build_contrastive_loss("tml", contrastive_margin=m, tml_anchors="all")(outputs(), STRUCT).item()
    assert value == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    nonzero = [t for t in terms if t > 0]
    library = build_contrastive_loss("tml", contrastive_margin=m, tml_anchors="all", tml_reduction="nonzero")
    assert library(outputs(), STRUCT).item() == pytest.approx(sum(nonzero) / len(nonzero), rel=1e-5)
    positives = build_contrastive_loss("tml", contrastive_margin=m)(outputs(), STRUCT).item()
    assert abs(positives - value) > 1e-3  # the two readings differ on this batch
