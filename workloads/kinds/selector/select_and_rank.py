"""Select-and-rank (Leonhardt et al., *Extractive Explanations for Interpretable Text
Ranking*, TOIS 2023): a sentence selector picks k sentences of a document, a cross-encoder
ranks the query against them; both are trained jointly.

The ranker reads ``[CLS] q [SEP] selected sentences in document order [SEP]`` (the
tokenizer's own special tokens), truncated to the ranker's ``max_length``. Each selected
token's input embedding is multiplied by its sentence's weight from the selection: 1.0 in
the forward pass (an exact k-hot), the relaxed top-k's gradient backward, which is how the
ranking loss reaches the selector (``workloads.kinds.selector.subset``). At evaluation the
selection is the deterministic top-k.

A checkpoint is a directory: the ranker as a ``CrossEncoder`` checkpoint, the selector's
weights (``selector.safetensors``) and ``selector.json`` (its method and spec).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from workloads.kinds.rerank.augmentation.supervised import SelectorSpec
from workloads.kinds.selector import SELECTORS
from workloads.kinds.selector.features import SelectorBatch, SentenceTokenizer, TokenizedText, collate
from workloads.kinds.selector.subset import relaxed_topk, topk_mask
from workloads.models.cross_encoder import CrossEncoder
from workloads.text.glove import load_glove, resolve_glove_path

SELECTOR_WEIGHTS = "selector.safetensors"
SELECTOR_META = "selector.json"


def _selector_class(method: str):
    if method not in SELECTORS:
        raise ValueError(f"unknown selector '{method}' (known: {', '.join(SELECTORS)})")
    return SELECTORS[method]


def _glove_embedding(spec) -> tuple[nn.Embedding, dict[str, int]]:
    words, vectors = load_glove(resolve_glove_path(spec.glove_path))
    table = torch.cat([torch.zeros(1, vectors.shape[1]), torch.from_numpy(vectors)])  # row 0: unknown words
    return nn.Embedding.from_pretrained(table, freeze=not spec.glove_trainable), {w: i + 1 for w, i in words.items()}


class SelectAndRank(nn.Module):
    def __init__(self, method: str, spec, ranker: CrossEncoder):
        super().__init__()
        self.method, self.spec, self.ranker = method, spec, ranker
        glove_words = None
        if spec.embeddings == "glove":
            embedding, glove_words = _glove_embedding(spec)
        else:  # the ranker's word-piece table, shared: selector and ranker train the same rows
            embedding = ranker.encoder.get_input_embeddings()
        self.selector = _selector_class(method)(embedding, spec.dimension, spec.dropout)
        self.tokens = SentenceTokenizer.for_tokenizer(ranker.tokenizer, spec, glove_words)
        self._typed = getattr(ranker.encoder.config, "type_vocab_size", 0) > 1

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, method: str, spec, model_name: str, max_length: int, pooling: str = "cls") -> SelectAndRank:
        return cls(method, spec, CrossEncoder.from_pretrained(model_name, max_length, pooling))

    @classmethod
    def load(cls, directory: Path, max_length: int | None = None) -> SelectAndRank:
        meta = json.loads((Path(directory) / SELECTOR_META).read_text())
        ranker = CrossEncoder.from_pretrained(str(directory), max_length or meta["max_length"])
        model = cls(meta["method"], SelectorSpec.model_validate(meta["spec"]), ranker)
        model.selector.load_state_dict(load_file(str(Path(directory) / SELECTOR_WEIGHTS)))
        return model

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        self.ranker.save(directory)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.selector.state_dict().items()},
                  str(directory / SELECTOR_WEIGHTS))
        (directory / SELECTOR_META).write_text(json.dumps(
            {"method": self.method, "spec": self.spec.model_dump(mode="json"), "max_length": self.ranker.max_length}))

    # ------------------------------------------------------------------ inputs
    def batch(self, queries: list[str], documents: list[list[str]], document_keys: list[str] | None = None) -> SelectorBatch:
        keys = document_keys or [None] * len(documents)
        return collate([self.tokens.query(q) for q in queries],
                       [self.tokens.document(d, key) for d, key in zip(documents, keys)])

    # ------------------------------------------------------------------ forward
    def sentence_scores(self, batch: SelectorBatch) -> torch.Tensor:
        return self.selector(batch)

    def selection(self, scores: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training: the straight-through relaxed k-hot; evaluation: the deterministic top-k."""
        if self.training:
            return relaxed_topk(scores, mask, self.spec.k, self.spec.tau, generator)
        return topk_mask(scores, mask, self.spec.k)

    def _pair_template(self) -> tuple[list[list[int]], list[list[int]]]:
        """The tokenizer's special tokens around a (query, document) pair, and their segment ids,
        read off one encoded placeholder pair: ([prefix, middle, suffix], their token types)."""
        if getattr(self, "_template", None) is None:
            tokenizer = self.ranker.tokenizer
            first = tokenizer("a", add_special_tokens=False)["input_ids"]
            second = tokenizer("b", add_special_tokens=False)["input_ids"]
            encoded = tokenizer("a", "b", return_token_type_ids=True)
            ids, types = encoded["input_ids"], encoded.get("token_type_ids") or [0] * len(encoded["input_ids"])
            if len(first) != 1 or len(second) != 1 or first[0] not in ids or second[0] not in ids:
                raise ValueError("cannot read the tokenizer's pair template")
            i, j = ids.index(first[0]), len(ids) - 1 - ids[::-1].index(second[0])
            self._template = ([ids[:i], ids[i + 1:j], ids[j + 1:]], [types[:i], types[i + 1:j], types[j + 1:]],
                              (types[i], types[j]))
        return self._template

    def _ranker_inputs(self, queries: list[TokenizedText], documents: list[TokenizedText], chosen: torch.Tensor):
        """Token ids, the sentence each token comes from (-1: query and special tokens) and
        segment ids of ``[CLS] q [SEP] selected sentences [SEP]``."""
        (prefix, middle, suffix), (prefix_types, middle_types, suffix_types), (query_type, doc_type) = self._pair_template()
        special = len(prefix) + len(middle) + len(suffix)
        rows = []
        picked = chosen.detach().cpu() > 0.5
        for b, (query, document) in enumerate(zip(queries, documents)):
            query_ids = list(query.ranker_ids[0])
            budget = max(0, self.ranker.max_length - special - len(query_ids))
            doc_ids, sources = [], []
            for s in range(document.sentences):  # document order
                if not picked[b, s] or budget <= 0:
                    continue
                piece = list(document.ranker_ids[s][:budget])
                doc_ids += piece
                sources += [s] * len(piece)
                budget -= len(piece)
            ids = prefix + query_ids + middle + doc_ids + suffix
            source = [-1] * (len(prefix) + len(query_ids) + len(middle)) + sources + [-1] * len(suffix)
            types = (prefix_types + [query_type] * len(query_ids) + middle_types + [doc_type] * len(doc_ids) + suffix_types)
            rows.append((ids, source, types))
        length = max(len(r[0]) for r in rows)
        pad = self.ranker.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
        source = torch.full((len(rows), length), -1, dtype=torch.long)
        token_types = torch.zeros((len(rows), length), dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        for b, (ids, src, types) in enumerate(rows):
            input_ids[b, : len(ids)] = torch.tensor(ids)
            source[b, : len(ids)] = torch.tensor(src)
            token_types[b, : len(types)] = torch.tensor(types)
            attention[b, : len(ids)] = 1
        return input_ids, source, token_types, attention

    def forward(self, batch: SelectorBatch, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ranking scores [B], Phi [B, H]) of the pairs on their selected sentences."""
        scores = self.sentence_scores(batch)
        chosen = self.selection(scores, batch.sentence_mask, generator)
        device = scores.device
        input_ids, source, token_types, attention = (t.to(device) for t in self._ranker_inputs(batch.queries, batch.documents, chosen))
        weight = torch.where(source >= 0, chosen.gather(1, source.clamp(min=0)), torch.ones_like(source, dtype=chosen.dtype))
        embeds = self.ranker.encoder.get_input_embeddings()(input_ids) * weight.unsqueeze(-1)
        extra = {"token_type_ids": token_types} if self._typed else {}
        hidden = self.ranker.encoder(inputs_embeds=embeds, attention_mask=attention, **extra).last_hidden_state
        return self.ranker.head(hidden, attention)

    @torch.no_grad()
    def score_sentences(self, query: str, sentences: list[str]) -> list[float]:
        """The selector's score of every sentence (eval mode); sentences past the caps score -inf."""
        was_training = self.training
        self.eval()
        batch = self.batch([query], [sentences]).to(next(self.parameters()).device)
        scores = self.sentence_scores(batch)[0].float().cpu().tolist()
        self.train(was_training)
        kept = int(batch.sentence_mask[0].sum())
        return scores[:kept] + [float("-inf")] * (len(sentences) - kept)

    @torch.no_grad()
    def score_pairs(self, queries: list[str], documents: list[list[str]], keys: list[str], batch_size: int = 32,
                    progress=None) -> list[float]:
        """Select-and-rank scores of (query, document) pairs, in length-sorted batches (eval mode)."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        order = sorted(range(len(queries)), key=lambda i: sum(len(s) for s in documents[i]))
        out = [0.0] * len(queries)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = self.batch([queries[i] for i in idx], [documents[i] for i in idx], [keys[i] for i in idx]).to(device)
            scores, _ = self(batch)
            for i, s in zip(idx, scores.float().cpu().tolist()):
                out[i] = s
            if progress:
                progress(min(start + batch_size, len(order)), len(order))
        self.train(was_training)
        return out
