"""A bi-encoder over any Hugging Face encoder: E(q) and E(d), compared by inner product.

One tower (``shared``: queries and documents through the same encoder, as DiffCSE's DPR
experiment and SimCSE) or two (a query tower and a document tower, as DPR). The embedding is
the final layer's first token (``cls``) or the mean over real tokens (``mean``, what
sentence-transformers' all-MiniLM-L6-v2 was trained with), L2-normalised when ``normalize``
(inner product = cosine). A checkpoint saved with sentence-transformers (``modules.json``)
tells its own pooling and normalisation when they are not given.

The module's ``forward`` returns embeddings with gradients, so the dense kind trains it in
the project's loop; ``encode_queries`` / ``encode_documents`` embed text for search (no
gradient state, length-sorted batches, float32 numpy). A checkpoint is a directory:
``save_pretrained`` of the encoder(s) and the tokenizer plus ``bi_encoder.json``; it reloads
offline with :meth:`BiEncoder.from_pretrained`. :meth:`BiEncoder.fingerprint` is its content
identity (weights, tokenizer, pooling, lengths), which keys the corpus embeddings stored for it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase

from workloads.core.errors import InputError
from workloads.models.cross_encoder import POOLER_MODEL_TYPES, autocast_dtype, resolve_model_name

META_FILE = "bi_encoder.json"
QUERY_TOWER, DOCUMENT_TOWER = "query", "document"  # subdirectories of a checkpoint with separate towers
POOLINGS = ("cls", "mean")
Side = Literal["query", "document"]


def _sentence_transformers_head(path: Path) -> tuple[str | None, bool | None]:
    """(pooling, normalize) a sentence-transformers checkpoint declares, else (None, None)."""
    modules = path / "modules.json"
    if not modules.is_file():
        return None, None
    entries = json.loads(modules.read_text())
    pooling = None
    for entry in entries:
        if entry.get("type", "").endswith("Pooling"):
            config = json.loads((path / entry["path"] / "config.json").read_text())
            pooling = "mean" if config.get("pooling_mode_mean_tokens") else "cls" if config.get("pooling_mode_cls_token") else None
    return pooling, any(entry.get("type", "").endswith("Normalize") for entry in entries)


def declared_normalization(name: str) -> bool:
    """Whether the encoder at ``name`` (alias, path) normalises its embeddings by its own declaration:
    one of our checkpoints' settings, or a sentence-transformers ``Normalize`` module."""
    path = Path(resolve_model_name(name)).expanduser()
    if (path / META_FILE).is_file():
        return bool(json.loads((path / META_FILE).read_text())["normalize"])
    return bool(_sentence_transformers_head(path)[1])


def _load_encoder(path: str, name: str) -> nn.Module:
    try:
        config = AutoConfig.from_pretrained(path)
        # BERT-style encoders build a pooler the embedding never uses (and DDP would find no gradient for).
        extra = {"add_pooling_layer": False} if config.model_type in POOLER_MODEL_TYPES else {}
        return AutoModel.from_pretrained(path, config=config, **extra)
    except (OSError, ValueError) as exc:
        raise InputError(name, f"cannot load encoder ({str(exc).splitlines()[0]})") from None


class BiEncoder(nn.Module):
    """Query and document embeddings from one shared encoder or two towers.

    Args:
        query_encoder: the (query) tower, a Hugging Face ``AutoModel``.
        tokenizer: the tokenizer of both towers.
        document_encoder: the document tower; None shares ``query_encoder``.
        pooling: ``cls`` or ``mean``.
        normalize: L2-normalise embeddings (inner product = cosine).
        query_max_length / document_max_length: truncation, in tokens (cut to the encoder's positions).
    """

    def __init__(self, query_encoder: nn.Module, tokenizer: PreTrainedTokenizerBase, document_encoder: nn.Module | None = None,
                 pooling: str = "cls", normalize: bool = False, query_max_length: int = 64, document_max_length: int = 256):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling '{pooling}' (choose from {', '.join(POOLINGS)})")
        self.query_encoder = query_encoder
        self.document_encoder = document_encoder
        self.tokenizer = tokenizer
        self.pooling, self.normalize = pooling, bool(normalize)
        positions = getattr(query_encoder.config, "max_position_embeddings", None) or max(query_max_length, document_max_length)
        self.query_max_length = min(query_max_length, positions)
        self.document_max_length = min(document_max_length, positions)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, name: str, pooling: str | None = None, normalize: bool | None = None, shared: bool = True,
                        query_max_length: int = 64, document_max_length: int = 256) -> BiEncoder:
        """A Hugging Face encoder (id, local path or alias such as ``minilm-l6``) or one of our
        checkpoints (its saved settings win over the arguments, but for the lengths, which cap
        them). ``pooling``/``normalize`` None: what a sentence-transformers checkpoint declares,
        else ``cls`` without normalisation. ``shared: false`` starts both towers from the same weights."""
        path = resolve_model_name(name)
        meta_path = Path(path).expanduser() / META_FILE
        if meta_path.is_file():  # one of ours
            meta = json.loads(meta_path.read_text())
            root = meta_path.parent
            tokenizer = AutoTokenizer.from_pretrained(str(root))
            if meta["shared"]:
                query, document = _load_encoder(str(root), name), None
            else:
                query, document = _load_encoder(str(root / QUERY_TOWER), name), _load_encoder(str(root / DOCUMENT_TOWER), name)
            return cls(query, tokenizer, document, meta["pooling"], meta["normalize"],
                       min(query_max_length, meta["query_max_length"]), min(document_max_length, meta["document_max_length"]))
        declared_pooling, declared_normalize = _sentence_transformers_head(Path(path).expanduser())
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise InputError(name, f"cannot load tokenizer ({str(exc).splitlines()[0]})") from None
        query = _load_encoder(path, name)
        document = None if shared else copy.deepcopy(query)
        return cls(query, tokenizer, document, pooling or declared_pooling or "cls",
                   bool(declared_normalize) if normalize is None else normalize, query_max_length, document_max_length)

    @property
    def shared(self) -> bool:
        return self.document_encoder is None

    @property
    def hidden_size(self) -> int:
        return int(self.query_encoder.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def settings(self) -> dict:
        """What :meth:`save` writes beside the weights (and :meth:`fingerprint` hashes)."""
        return {"shared": self.shared, "pooling": self.pooling, "normalize": self.normalize,
                "query_max_length": self.query_max_length, "document_max_length": self.document_max_length}

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        towers = {"": self.query_encoder} if self.shared else {QUERY_TOWER: self.query_encoder, DOCUMENT_TOWER: self.document_encoder}
        for sub, encoder in towers.items():
            encoder = encoder.module if hasattr(encoder, "module") else encoder
            encoder.save_pretrained(directory / sub, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        (directory / META_FILE).write_text(json.dumps(self.settings()))

    def fingerprint(self) -> str:
        """Content identity: every weight, the tokenizer's vocabulary and :meth:`settings`.
        Two encoders with one fingerprint embed every text alike (in one precision)."""
        digest = hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode())
        digest.update(type(self.query_encoder).__name__.encode())
        for name, tensor in sorted(self.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        vocab = self.tokenizer.get_vocab()
        digest.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
        digest.update(str(getattr(self.tokenizer, "do_lower_case", "")).encode())
        return digest.hexdigest()[:32]

    # ------------------------------------------------------------------ forward
    def tower(self, side: Side) -> nn.Module:
        if side not in (QUERY_TOWER, DOCUMENT_TOWER):
            raise ValueError(f"side must be '{QUERY_TOWER}' or '{DOCUMENT_TOWER}', not '{side}'")
        return self.query_encoder if side == QUERY_TOWER or self.shared else self.document_encoder

    def tokenize(self, texts: Sequence[str], side: Side = "document") -> dict[str, torch.Tensor]:
        """Tokenized ``texts`` for ``side``'s tower, padded to the longest, truncated to its max length."""
        length = self.query_max_length if side == QUERY_TOWER else self.document_max_length
        return dict(self.tokenizer(list(texts), truncation=True, max_length=length, padding="longest", return_tensors="pt"))

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None, raw: bool = False) -> torch.Tensor:
        """The embedding from a tower's last hidden states [B, T, H] -> [B, H] (normalised when set,
        unless ``raw``: what a training-time pooler fed the un-normalised [CLS] reads)."""
        if self.pooling == "mean" and attention_mask is not None:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            embedding = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        elif self.pooling == "mean":
            embedding = hidden.mean(1)
        else:
            embedding = hidden[:, 0]
        return nn.functional.normalize(embedding, dim=-1) if self.normalize and not raw else embedding

    def forward(self, side: Side = "document", raw: bool = False, **inputs: torch.Tensor) -> torch.Tensor:
        """Embeddings [B, H] of :meth:`tokenize`'s tensors through ``side``'s tower (with gradients when
        training); ``raw``: before the L2 normalisation."""
        hidden = self.tower(side)(**inputs).last_hidden_state
        return self.pool(hidden, inputs.get("attention_mask"), raw)

    # ------------------------------------------------------------------ inference
    @torch.inference_mode()
    def encode(self, texts: Sequence[str], side: Side = "document", batch_size: int = 64, device: torch.device | None = None,
               precision: str = "fp32", progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Embeddings of ``texts`` as float32 [N, H], in input order: batches of similar length
        (less padding, same embeddings), eval mode (no dropout), then the mode it was in."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        device = device or self.device
        was_training = self.training
        self.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.hidden_size), dtype=np.float32)
        try:
            for start in range(0, len(order), batch_size):
                index = order[start:start + batch_size]
                inputs = {k: v.to(device) for k, v in self.tokenize([texts[i] for i in index], side).items()}
                dtype = autocast_dtype(device, precision)
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    embeddings = self(side, **inputs)
                out[index] = embeddings.float().cpu().numpy()
                if progress:
                    progress(min(start + batch_size, len(order)), len(order))
        finally:
            self.train(was_training)
        return out

    def encode_queries(self, texts: Sequence[str], **options) -> np.ndarray:
        return self.encode(texts, QUERY_TOWER, **options)

    def encode_documents(self, texts: Sequence[str], **options) -> np.ndarray:
        return self.encode(texts, DOCUMENT_TOWER, **options)


__all__ = ["BiEncoder", "POOLINGS", "META_FILE", "declared_normalization"]
