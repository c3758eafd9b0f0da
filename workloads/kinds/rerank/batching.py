"""How training rows become steps (``optimization.batching``; CFT section 4, docs/guide/robustness.md),
and batches that carry their structure.

A training row is one judged-relevant (q, d+) with its negatives of the same query
(``training_data.negatives``, drawn from the first-stage list). A step holds
``optimization.batch_size`` pairs:

- ``triples`` (default, AUG): batch_size / 2 rows, each (q, d+) and (q, d-), plus their
  augmented pairs (AUG Algorithm 1);
- ``per_query``: batch_size / (1 + n) rows, each 1 positive and its n negatives, what max
  hinge (MHL) and listwise losses need (CFT: 1 + 15);
- ``cft``: CFT's contrastive batches: one row's 1 positive + n negatives, and the positives
  of ``cft_positives - 1`` rows of other, distinct queries (CFT: 16 positives + 15
  negatives), so TML has positives of other queries.

Every row is used once per epoch (as a group; a ``cft`` row may also lend its positive to
other batches); the order is shuffled by (seed, epoch), the same on every worker, which
then takes every world-th batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from workloads.losses.base import PairStructure


@dataclass
class PairBatch:
    queries: list[str]
    documents: list[str]
    structure: PairStructure


def triples_to_batch(rows: list[dict]) -> PairBatch:
    """Turn training triples into a batch: 2 pairs per triple, then 2 more per augmented row.

    Rows with ``augmented_positive`` (AUG Algorithm 1) append (q, d+_a), whose ``source`` is
    the index of its original (q, d+), and (q, d-_a), a random non-relevant document
    (augmented, but made from no pair: source -1). The augmented pairs form their own triple.
    """
    queries: list[str] = []
    documents: list[str] = []
    labels: list[float] = []
    query_ids: list[int] = []
    triple_ids: list[int] = []
    augmented: list[bool] = []
    source: list[int] = []
    query_index: dict[str, int] = {}

    def add(query: str, text: str, label: float, q: int, triple: int, is_augmented: bool, from_pair: int) -> int:
        queries.append(query)
        documents.append(text)
        labels.append(label)
        query_ids.append(q)
        triple_ids.append(triple)
        augmented.append(is_augmented)
        source.append(from_pair)
        return len(labels) - 1

    originals = []
    for t, row in enumerate(rows):
        q = query_index.setdefault(row["query_id"], len(query_index))
        positive = add(row["query"], row["positive"], 1.0, q, t, False, -1)
        add(row["query"], row["negative"], 0.0, q, t, False, -1)
        originals.append(positive)
    teacher = teacher_scores(rows, [[row.get("negative_score")] for row in rows], len(labels))
    for t, row in enumerate(rows):
        if row.get("augmented_positive") is None:
            continue
        q = query_index[row["query_id"]]
        add(row["query"], row["augmented_positive"], 1.0, q, len(rows) + t, True, originals[t])
        add(row["query"], row["augmented_negative"], 0.0, q, len(rows) + t, True, -1)
    structure = PairStructure(
        labels=torch.tensor(labels),
        query_ids=torch.tensor(query_ids, dtype=torch.long),
        triple_ids=torch.tensor(triple_ids, dtype=torch.long),
        augmented=torch.tensor(augmented, dtype=torch.bool),
        source=torch.tensor(source, dtype=torch.long),
        teacher=teacher,
    )
    return PairBatch(queries, documents, structure)


def teacher_scores(rows: list[dict], negatives: list[list], pairs: int) -> torch.Tensor | None:
    """The miner's scores of each row's positive and negatives (mined training sets keep them), in
    the order the rows' pairs were added first, NaN for every later pair; None without scores."""
    if not rows or any(row.get("positive_score") is None for row in rows):
        return None
    values = [v for row, scores in zip(rows, negatives) for v in (row["positive_score"], *scores)]
    return torch.tensor(values + [float("nan")] * (pairs - len(values)), dtype=torch.float)


BATCHINGS = ("triples", "per_query", "cft")


@dataclass(frozen=True)
class PlannedBatch:
    groups: tuple[int, ...]                  # rows giving (q, d+) and every negative
    extra_positives: tuple[int, ...] = ()    # rows giving (q, d+) alone (cft)


def rows_per_batch(batching: str, batch_size: int, negatives: int) -> int:
    return batch_size // 2 if batching == "triples" else batch_size // (1 + negatives) if batching == "per_query" else 1


BUCKET_BATCHES = 50  # batches per length-sorted window: local sorting keeps the order random across windows


def row_length(row: dict) -> int:
    """A row's text length in characters (the padding a batch needs follows it)."""
    negatives = row.get("negatives") or [row.get("negative") or ""]
    return len(row["query"]) + len(row["positive"]) + max(len(n) for n in negatives)


def bucketed(order: list[int], rows: list[dict], size: int, rng: random.Random) -> list[list[int]]:
    """Length-bucketed batches: the shuffled rows in windows of ``BUCKET_BATCHES`` batches, each
    window sorted by length and cut into batches, then the batches shuffled. Every row is in
    exactly one batch (the incomplete last one is dropped); the result depends only on the
    order and the RNG (seeded)."""
    usable = len(order) // size * size
    window = size * BUCKET_BATCHES
    batches = []
    for start in range(0, usable, window):
        chunk = sorted(order[start:min(start + window, usable)], key=lambda i: row_length(rows[i]))
        batches += [chunk[b:b + size] for b in range(0, len(chunk), size)]
    rng.shuffle(batches)
    return batches


def plan_epoch(rows: list[dict], batching: str, batch_size: int, negatives: int, cft_positives: int, seed: int,
               epoch: int, length_bucketing: bool = False) -> list[PlannedBatch]:
    """Every step of an epoch (an incomplete last batch is dropped). ``length_bucketing``
    groups rows of similar length into batches (less padding; :func:`bucketed`)."""
    if batching not in BATCHINGS:
        raise ValueError(f"unknown batching '{batching}' (known: {', '.join(BATCHINGS)})")
    if length_bucketing and batching == "cft":
        raise ValueError("length_bucketing does not apply to cft batches (their positives come from other queries)")
    order = list(range(len(rows)))
    random.Random(seed * 1_000 + epoch).shuffle(order)  # the triples order since the first trial: keep it
    size = rows_per_batch(batching, batch_size, negatives)
    if length_bucketing:
        groups = bucketed(order, rows, size, random.Random(f"buckets-{seed}-{epoch}"))
        return [PlannedBatch(tuple(g)) for g in groups]
    batches = [PlannedBatch(tuple(order[b * size:(b + 1) * size])) for b in range(len(rows) // size)]
    if batching != "cft":
        return batches
    by_query: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_query.setdefault(row["query_id"], []).append(i)
    if len(by_query) < cft_positives:
        raise ValueError(f"cft batches need {cft_positives} distinct training queries, the training set has {len(by_query)}")
    queries = sorted(by_query)
    position = {q: i for i, q in enumerate(queries)}
    rng = random.Random(f"cft-{seed}-{epoch}")
    planned = []
    for batch in batches:
        skip = position[rows[batch.groups[0]]["query_id"]]
        # the other queries without building their list (O(k), not O(queries), per batch): an index
        # drawn from range(n - 1) steps over the anchor's (random.sample picks the same indices
        # from a range as from a list of that length)
        picked = [i + (i >= skip) for i in rng.sample(range(len(queries) - 1), cft_positives - 1)]
        planned.append(PlannedBatch(batch.groups, tuple(rng.choice(by_query[queries[i]]) for i in picked)))
    return planned


def row_negatives(row: dict) -> list[tuple[str, str]]:
    """(doc id, text) of a row's negatives: the list columns when present, else its one negative."""
    if row.get("negative_ids") is not None:
        return list(zip(row["negative_ids"], row["negatives"]))
    return [(row["negative_id"], row["negative"])]


def lists_to_batch(groups: list[dict], extra_positives: list[dict] = ()) -> PairBatch:
    """Per-query lists: each group's (q, d+) then its (q, d-_j); then the (q, d+) of the extra rows.
    Pairs of one query share a query id; each group (and each extra positive) is one triple id."""
    queries, documents, labels, query_ids, triple_ids = [], [], [], [], []
    index: dict[str, int] = {}

    def add(row: dict, text: str, label: float, triple: int) -> None:
        queries.append(row["query"])
        documents.append(text)
        labels.append(label)
        query_ids.append(index.setdefault(row["query_id"], len(index)))
        triple_ids.append(triple)

    for t, row in enumerate(groups):
        add(row, row["positive"], 1.0, t)
        for _, text in row_negatives(row):
            add(row, text, 0.0, t)
    teacher = teacher_scores(groups, [row.get("negative_scores") or [row.get("negative_score")] for row in groups],
                             len(labels) + len(extra_positives))
    for t, row in enumerate(extra_positives, len(groups)):
        add(row, row["positive"], 1.0, t)
    n = len(labels)
    structure = PairStructure(torch.tensor(labels), torch.tensor(query_ids, dtype=torch.long),
                              torch.tensor(triple_ids, dtype=torch.long), torch.zeros(n, dtype=torch.bool),
                              torch.full((n,), -1, dtype=torch.long), teacher)
    return PairBatch(queries, documents, structure)


def make_batch(rows: list[dict], planned: PlannedBatch, batching: str) -> PairBatch:
    if batching == "triples":
        return triples_to_batch([rows[i] for i in planned.groups])
    return lists_to_batch([rows[i] for i in planned.groups], [rows[i] for i in planned.extra_positives])


__all__ = ["BATCHINGS", "PlannedBatch", "plan_epoch", "bucketed", "row_length", "make_batch", "lists_to_batch",
           "row_negatives", "rows_per_batch"]
