"""The attention selector (AUG eq. 10-16: QA-LSTM; Leonhardt et al.'s select-and-rank "attention").

One BiLSTM (``dimension`` units per direction) is shared by the query and the whole
document (not run per sentence). q^ = max-pool of the query states; for each document
state h_i: m_i = W1 h_i + W2 q^, a_i = W3 tanh(m_i) (eq. 13 prints h_1: a typo for h_i);
a sentence's s^ = max-pool over its tokens of h_i * w_i; score = cos(q^, s^), with
dropout on q^ and s^ while training.

Eq. 14 weighs h_i by exp(a_i). We weigh by the softmax of a over the tokens of the
sentence, w_i = exp(a_i) / Z_s, as the reference implementation does: Z_s > 0 is one
number per sentence, the max-pool commutes with a positive scale (max_i(c x_i) =
c max_i(x_i), elementwise) and the cosine ignores the scale of s^, so the scores are
exactly eq. 14's, and exp never overflows (``per_sentence_softmax=False`` computes eq. 14
as printed; a test checks both agree).

Args:
    embedding: the token embedding table (the ranker's word pieces, shared, or GloVe).
    dimension: LSTM units per direction (256); W1, W2: 2d -> d; W3: d -> 1.
    dropout: on q^ and s^, training only (0.1).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from workloads.kinds.selector.features import SelectorBatch, per_sentence


class AttentionSelector(nn.Module):
    name = "attention"

    def __init__(self, embedding: nn.Embedding, dimension: int = 256, dropout: float = 0.1):
        super().__init__()
        self.embedding = embedding
        self.lstm = nn.LSTM(embedding.embedding_dim, dimension, batch_first=True, bidirectional=True)
        self.w1 = nn.Linear(2 * dimension, dimension)
        self.w2 = nn.Linear(2 * dimension, dimension)
        self.w3 = nn.Linear(dimension, 1)
        self.dropout = nn.Dropout(dropout)
        self.per_sentence_softmax = True

    def _states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        lengths = mask.sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(self.embedding(ids), lengths, batch_first=True, enforce_sorted=False)
        states, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=ids.shape[1])
        return states

    def forward(self, batch: SelectorBatch) -> torch.Tensor:
        """Sentence scores [B, S] (padding sentences: whatever; read them through the mask)."""
        query_states = self._states(batch.query_ids, batch.query_mask)
        query = query_states.masked_fill(~batch.query_mask.unsqueeze(-1), float("-inf")).amax(1)
        states = self._states(batch.document_ids, batch.document_mask)
        attention = self.w3(torch.tanh(self.w1(states) + self.w2(query).unsqueeze(1))).squeeze(-1)  # a_i [B, L]
        sentences = batch.sentence_mask.shape[1]
        if self.per_sentence_softmax:
            peak = per_sentence(attention.unsqueeze(-1), batch.token_sentence, sentences, "amax").squeeze(-1)
            peak = torch.cat([peak, peak.new_zeros(peak.shape[0], 1)], dim=1).gather(1, batch.token_sentence)
            weight = torch.exp(attention - peak) * batch.document_mask
            total = per_sentence(weight.unsqueeze(-1), batch.token_sentence, sentences, "sum").squeeze(-1)
            total = torch.cat([total, total.new_ones(total.shape[0], 1)], dim=1).gather(1, batch.token_sentence)
            weight = weight / total.clamp(min=1e-30)
        else:  # eq. 14 as printed
            weight = torch.exp(attention) * batch.document_mask
        weighted = states * weight.unsqueeze(-1)
        sentence = per_sentence(weighted, batch.token_sentence, sentences, "amax")
        return torch.cosine_similarity(self.dropout(query).unsqueeze(1), self.dropout(sentence), dim=-1)
