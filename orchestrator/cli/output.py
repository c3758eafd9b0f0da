"""Where a command's result goes, and the tables every command prints the same way.

The result (a table, ``--json``) goes to the real stdout; everything else printed in the process
(Ray forwards worker and raylet messages to the driver's ``sys.stdout``, at any time up to exit)
goes to stderr, so ``--json`` output stays parseable.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from workloads.evaluation import DISPLAY_NAMES, MEASURES

_result_stream = sys.stdout


def route_results() -> None:
    """For the rest of the process, exit included (Ray flushes deduplicated worker and raylet
    messages from atexit handlers), and at the descriptor level too (native code and child
    processes write to fd 1 directly): fd 1 becomes stderr, results go to a copy of it."""
    global _result_stream
    sys.stdout.flush()
    _result_stream = os.fdopen(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(*parts: object) -> None:
    print(*parts, file=_result_stream, flush=True)


def metrics_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    names = [n for n in MEASURES if any(n in metrics for _, metrics in rows)]  # the measures the rows have
    width = max([28] + [len(label) + 2 for label, _ in rows])
    header = f"{'':<{width}}" + "".join(f"{DISPLAY_NAMES[n]:>9}" for n in names)
    lines = [header]
    for label, metrics in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{metrics[n]:>9.4f}" if n in metrics else f"{'-':>9}" for n in names))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- option values


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, where it has one worth saying (not None, not a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "default:" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def bounded(kind: type, low: float | None = None, high: float | None = None, what: str = "a value"):
    """An argparse ``type`` that takes a finite number in [low, high] (one line otherwise)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"at least {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: {what} must be {span}")
        return value

    return parse


def add_tracking(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking store: sqlite:///FILE, http(s)://HOST:PORT, postgresql://... "
                             "(default: $MLFLOW_TRACKING_URI, else sqlite in ./.orchestrate/mlflow.db)")


def add_storage(parser: argparse.ArgumentParser, default: str = ".orchestrate/sweeps") -> None:
    parser.add_argument("--storage", default=default, metavar="DIR",
                        help="where sweeps keep their Optuna studies and Ray checkpoints (shared storage on a cluster)")


def add_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", metavar="RAY",
                        help="Ray cluster to run on, host:port or ray://host:port; local: a private Ray on this machine "
                             "(default: $RAY_ADDRESS, else the cluster `ray start` runs on this machine, else a private Ray)")
