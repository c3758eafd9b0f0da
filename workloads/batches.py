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

    def to(self, device: torch.device) -> "PairStructure":
        return PairStructure(*(t.to(device) for t in (self.labels, self.query_ids, self.triple_ids, self.augmented, self.source)))

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class PairBatch:
    queries: list[str]
    documents: list[str]
    structure: PairStructure


def triples_to_batch(rows: list[dict]) -> PairBatch:
    """Turn training triples (query, positive, negative) into a batch of 2 pairs per triple."""
    queries, documents, labels, query_ids, triple_ids = [], [], [], [], []
    query_index: dict[str, int] = {}
    for t, row in enumerate(rows):
        q = query_index.setdefault(row["query_id"], len(query_index))
        for text, label in ((row["positive"], 1.0), (row["negative"], 0.0)):
            queries.append(row["query"])
            documents.append(text)
            labels.append(label)
            query_ids.append(q)
            triple_ids.append(t)
    n = len(labels)
    structure = PairStructure(
        labels=torch.tensor(labels),
        query_ids=torch.tensor(query_ids, dtype=torch.long),
        triple_ids=torch.tensor(triple_ids, dtype=torch.long),
        augmented=torch.zeros(n, dtype=torch.bool),
        source=torch.full((n,), -1, dtype=torch.long),
    )
    return PairBatch(queries, documents, structure)
