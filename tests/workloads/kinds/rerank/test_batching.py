"""Batch composition (optimization.batching): triples, per-query lists, CFT's contrastive batches."""

import random

import pytest
import torch

from workloads.kinds.rerank.batching import lists_to_batch, make_batch, plan_epoch, row_length
from workloads.kinds.rerank.spec import OptimizationSpec, TrialSpec
from workloads.kinds.rerank.training_sets import sample_triples
from workloads.losses import ModelOutputs, build_ranking_loss


def _rows(queries: int, positives_per_query: int = 1, negatives: int = 3) -> list[dict]:
    rows = []
    for q in range(queries):
        for p in range(positives_per_query):
            ids = [f"n{q}-{j}" for j in range(negatives)]
            rows.append({"query_id": f"q{q}", "query": f"query {q}", "positive_id": f"p{q}-{p}", "positive": f"pos {q}-{p}",
                         "negative_id": ids[0], "negative": f"neg {ids[0]}", "negative_ids": ids,
                         "negatives": [f"neg {i}" for i in ids]})
    return rows


def test_triples_keep_the_order_every_trial_has_trained_in():
    rows = _rows(10)
    order = list(range(10))
    random.Random(7 * 1_000 + 2).shuffle(order)  # the loop's order before batching was configurable
    planned = plan_epoch(rows, "triples", 4, 1, 16, seed=7, epoch=2)
    assert [b.groups for b in planned] == [tuple(order[0:2]), tuple(order[2:4]), tuple(order[4:6]), tuple(order[6:8]),
                                          tuple(order[8:10])]


def test_every_per_query_batch_holds_exactly_one_positive_and_n_negatives_of_one_query():
    rows = _rows(12, positives_per_query=2, negatives=3)
    planned = plan_epoch(rows, "per_query", 4, 3, 16, seed=1, epoch=1)  # 4 pairs = 1 + 3: one list per step
    assert sorted(i for b in planned for i in b.groups) == list(range(len(rows)))  # each row once per epoch
    for b in planned:
        batch = make_batch(rows, b, "per_query")
        s = batch.structure
        assert len(s) == 4 and s.labels.tolist() == [1.0, 0.0, 0.0, 0.0]
        assert len(set(s.query_ids.tolist())) == 1 and len({q for q in batch.queries}) == 1
        assert batch.documents[1:] == rows[b.groups[0]]["negatives"]
    two = plan_epoch(rows, "per_query", 8, 3, 16, seed=1, epoch=1)  # two lists per step
    assert all(len(b.groups) == 2 for b in two) and len(two) == len(rows) // 2


def test_a_cft_batch_holds_one_list_and_positives_of_distinct_other_queries():
    rows = _rows(20, positives_per_query=2, negatives=3)
    planned = plan_epoch(rows, "cft", 7, 3, 4, seed=5, epoch=1)  # 4 positives + 3 negatives (CFT: 16 + 15)
    assert sorted(i for b in planned for i in b.groups) == list(range(len(rows)))
    for b in planned:
        batch = make_batch(rows, b, "cft")
        s = batch.structure
        assert len(s) == 7 and int(s.labels.sum()) == 4
        positive_queries = [q for q, label in zip(s.query_ids.tolist(), s.labels.tolist()) if label == 1.0]
        assert len(set(positive_queries)) == 4  # distinct queries
        negative_queries = {q for q, label in zip(s.query_ids.tolist(), s.labels.tolist()) if label == 0.0}
        assert negative_queries == {positive_queries[0]}  # the negatives are the first list's
    assert planned == plan_epoch(rows, "cft", 7, 3, 4, seed=5, epoch=1)  # deterministic
    assert planned != plan_epoch(rows, "cft", 7, 3, 4, seed=5, epoch=2)
    with pytest.raises(ValueError, match="need 4 distinct training queries"):
        plan_epoch(_rows(3), "cft", 7, 3, 4, seed=5, epoch=1)


def test_mhl_on_a_list_takes_its_hardest_negative():
    batch = lists_to_batch(_rows(1, negatives=3))
    scores = torch.tensor([2.0, 0.5, 1.5, -1.0])  # positive, then three negatives
    loss = build_ranking_loss("mhl", margin=1.0)(ModelOutputs(scores, torch.zeros(4, 2)), batch.structure)
    assert loss.item() == pytest.approx(max(0.0, 1.0 - 2.0 + 1.5))


def test_sampling_n_negatives_draws_distinct_negatives_of_the_same_query():
    run = {"q1": {f"d{i}": 10.0 - i for i in range(8)}, "q2": {"x0": 2.0, "x1": 1.0}}
    qrels = {"q1": {"d0": 1, "d3": 1}, "q2": {"x0": 1}}
    triples, _ = sample_triples(run, qrels, ["q1", "q2"], 1, 8, seed=3, negatives=4)
    for t in triples:
        negatives = [t.negative_id, *t.more_negative_ids]
        assert len(set(negatives)) == len(negatives) and not set(negatives) & set(qrels[t.query_id])
        assert set(negatives) <= set(run[t.query_id])
        assert len(negatives) == (4 if t.query_id == "q1" else 1)  # q2 has one negative: it gives all it has
    assert triples == sample_triples(run, qrels, ["q1", "q2"], 1, 8, seed=3, negatives=4)[0]


def test_batching_settings_are_checked_against_each_other():
    def spec(**sections):
        return TrialSpec.model_validate({"name": "t", "data": {"collection": "c"}, "model": {"name": "m"}, **sections})

    assert spec(training_data={"negatives": 15, "size": 1600}, optimization={"batching": "per_query", "batch_size": 16})
    assert spec(training_data={"negatives": 15, "size": "full"}, optimization={"batching": "cft", "batch_size": 31})
    with pytest.raises(ValueError, match="needs batching per_query or cft"):
        spec(training_data={"negatives": 3, "size": 400})
    with pytest.raises(ValueError, match="batch_size 12 must be a multiple of 1 \\+ 15"):
        spec(training_data={"negatives": 15, "size": 1600}, optimization={"batching": "per_query", "batch_size": 12})
    with pytest.raises(ValueError, match="batch_size must be cft_positives \\+ training_data.negatives = 31"):
        spec(training_data={"negatives": 15, "size": 1600}, optimization={"batching": "cft", "batch_size": 32})
    with pytest.raises(ValueError, match="size must be a multiple of 16 pairs"):
        spec(training_data={"negatives": 15, "size": 1000}, optimization={"batching": "per_query", "batch_size": 16})
    with pytest.raises(ValueError, match="augmentation pairs each triple"):
        spec(optimization={"batching": "per_query", "batch_size": 16}, augmentation={"method": "bm25"})
    with pytest.raises(ValueError, match="cft_positives has no effect"):
        spec(optimization={"cft_positives": 8})


def _rows_of_lengths(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"query_id": f"q{i}", "query": "q" * rng.randint(5, 30), "positive": "p" * rng.randint(10, 2000),
             "negative": "n" * rng.randint(10, 2000), "positive_id": f"p{i}", "negative_id": f"n{i}"} for i in range(n)]


@pytest.mark.parametrize("batching, negatives", [("triples", 1), ("per_query", 3)])
def test_length_bucketing_uses_every_row_once_per_epoch_deterministically(batching, negatives):
    rows = _rows_of_lengths(1003)
    if negatives > 1:
        rows = [{**r, "negatives": [r["negative"]] * negatives, "negative_ids": ["x"] * negatives} for r in rows]
    size = 16  # 8 triples, or 4 lists of 1 + 3
    plan = plan_epoch(rows, batching, size, negatives, 16, seed=13, epoch=1, length_bucketing=True)
    per_batch = len(plan[0].groups)
    seen = [i for b in plan for i in b.groups]
    assert len(seen) == len(set(seen)) == 1003 // per_batch * per_batch  # each row once; the incomplete batch dropped
    assert all(len(b.groups) == per_batch for b in plan)
    assert plan == plan_epoch(rows, batching, size, negatives, 16, seed=13, epoch=1, length_bucketing=True)
    assert plan != plan_epoch(rows, batching, size, negatives, 16, seed=13, epoch=2, length_bucketing=True)
    assert plan != plan_epoch(rows, batching, size, negatives, 16, seed=14, epoch=1, length_bucketing=True)
    plain = plan_epoch(rows, batching, size, negatives, 16, seed=13, epoch=1)

    def padded(batches):  # what dynamic padding costs: every row padded to its batch's longest
        return sum(max(row_length(rows[i]) for i in b.groups) * len(b.groups) for b in batches)

    assert padded(plan) < 0.75 * padded(plain)
    # batches are not in length order (shuffled after bucketing)
    longest = [max(row_length(rows[i]) for i in b.groups) for b in plan]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)


def test_length_bucketing_is_refused_for_cft_batches():
    with pytest.raises(ValueError, match="length_bucketing does not apply to cft"):
        OptimizationSpec(batching="cft", batch_size=31, length_bucketing=True)
