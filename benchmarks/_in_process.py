"""One trial trained in this process, for the benchmarks that compare our loop with something."""

from __future__ import annotations

import shutil
import time
from pathlib import Path


def train_in_process(spec, inputs) -> tuple[list[dict], float]:
    """Train ``spec`` with ``workloads.training.train_cross_encoder`` (no Ray) on prepared
    ``inputs``: every epoch's metrics and the wall seconds. Checkpoints are written (a cost
    of every trial) and then dropped."""
    from workloads.training import train_cross_encoder

    epochs: list[dict] = []

    def keep(metrics: dict, checkpoint: Path | None) -> None:
        epochs.append(dict(metrics))
        if checkpoint is not None:
            shutil.rmtree(checkpoint, ignore_errors=True)

    started = time.perf_counter()
    train_cross_encoder(spec, inputs, keep)
    return epochs, time.perf_counter() - started
