"""The linear selector (AUG eq. 8-9; Leonhardt et al.'s select-and-rank "linear").

Enc(t) = mean_i (W t_i + b) over a sequence's token embeddings (= W mean_i t_i + b: the
affine map commutes with the mean); score(q, s) = <Enc(q), Enc(s)>, with dropout on both
encodings while training. AUG's section 7.3 says "max" pooling; its eq. 8 and the
reference code use the mean, and so do we.

Args:
    embedding: the token embedding table (the ranker's word pieces, shared, or GloVe).
    dimension: output size of the affine map (256 in the reference).
    dropout: on both encodings, training only (0.1).
"""

from __future__ import annotations

import torch
from torch import nn

from workloads.kinds.selector.features import SelectorBatch, per_sentence


class LinearSelector(nn.Module):
    name = "linear"

    def __init__(self, embedding: nn.Embedding, dimension: int = 256, dropout: float = 0.1):
        super().__init__()
        self.embedding = embedding
        self.project = nn.Linear(embedding.embedding_dim, dimension)
        self.dropout = nn.Dropout(dropout)

    def forward(self, batch: SelectorBatch) -> torch.Tensor:
        """Sentence scores [B, S] (padding sentences: whatever; read them through the mask)."""
        query_mask = batch.query_mask.unsqueeze(-1).to(self.project.weight.dtype)
        query = (self.embedding(batch.query_ids) * query_mask).sum(1) / query_mask.sum(1).clamp(min=1.0)
        sentences = batch.sentence_mask.shape[1]
        token_mask = batch.document_mask.unsqueeze(-1).to(self.project.weight.dtype)
        sums = per_sentence(self.embedding(batch.document_ids) * token_mask, batch.token_sentence, sentences, "sum")
        counts = per_sentence(token_mask, batch.token_sentence, sentences, "sum")
        query_code = self.dropout(self.project(query))
        sentence_code = self.dropout(self.project(sums / counts.clamp(min=1.0)))
        return (query_code.unsqueeze(1) * sentence_code).sum(-1)
