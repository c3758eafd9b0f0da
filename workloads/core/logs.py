"""One logging setup for the driver and every Ray worker: stdlib ``logging``, one formatter.

Loggers are named by area (``rerank_lab.train``, ``rerank_lab.augment``, ``rerank_lab.sweep``,
...) and print as ``[area] message``. The command line sets the level (``--verbose``,
``--quiet``) and passes it to Ray workers in ``ORCHESTRATE_LOG_LEVEL``, so a worker's
progress appears (or not) like the driver's.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

ROOT = "rerank_lab"
LEVEL_ENV = "ORCHESTRATE_LOG_LEVEL"


class AreaFormatter(logging.Formatter):
    """``[area] message``; warnings and errors also say so."""

    def format(self, record: logging.LogRecord) -> str:
        area = record.name.removeprefix(f"{ROOT}.") if record.name.startswith(ROOT) else record.name
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        message = f"[{area}] {level}{record.getMessage()}"
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return message


def get_logger(area: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{area}")


def configure(level: int | str | None = None, stream: TextIO | None = None) -> logging.Logger:
    """Give the project's loggers one handler on ``stream`` (default: stderr) at ``level``
    (default: ``$ORCHESTRATE_LOG_LEVEL``, else INFO). Idempotent: a second call replaces the first."""
    if level is None:
        level = os.environ.get(LEVEL_ENV, "INFO")
    root = logging.getLogger(ROOT)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(AreaFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # Ray's own root handlers would print every line a second time
    return root


def clock(seconds: float) -> str:
    """``4m05s``, ``1h02m``: elapsed and ETA in progress lines; ``?`` for NaN (nothing done yet to
    extrapolate from)."""
    if seconds != seconds:
        return "?"
    minutes, secs = divmod(int(max(0.0, seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """``[########------------]  40%``"""
    fraction = done / total if total else 1.0
    filled = round(fraction * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {fraction:>4.0%}"
