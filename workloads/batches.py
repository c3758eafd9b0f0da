"""Batches that carry their structure: each pair knows its query, label, triple and origin.

Losses read this structure instead of guessing it from positions in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PairStructure:
    """Per-pair facts of a batch, aligned with the model's outputs (all tensors of length B)."""

    labels: torch.Tensor      # float: 1.0 relevant, 0.0 not
    query_ids: torch.Tensor   # long: the same number for pairs of the same query (within the batch)
    triple_ids: torch.Tensor  # long: pairs made from the same (q, d+, d-) triple
    augmented: torch.Tensor   # bool: produced by an augmenter
    source: torch.Tensor      # long: index of the original pair an augmented pair was made from, else -1

    def to(self, device: torch.device) -> PairStructure:
        return PairStructure(*(t.to(device) for t in (self.labels, self.query_ids, self.triple_ids, self.augmented, self.source)))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


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
    )
    return PairBatch(queries, documents, structure)
