"""One trial trained in this process, for the benchmarks that compare our loop with something."""

from __future__ import annotations

import time


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
