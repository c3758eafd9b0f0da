"""Ray's own output while ``orchestrate run`` trains: the project's lines on the terminal, the
rest in a log file.

Ray forwards every line a worker prints to the driver (``log_to_driver``), prefixed with its
process (``(RayTrainWorker pid=1) ...``): the project's own lines (``[train] epoch 1/2 ...``)
and Ray Train's (``Reporting training result 1: TrainingReport(...)`` with every metric,
``GetTimeoutError`` tracebacks under load) alike, and Ray's driver loggers print their own.
Neither a logger level nor Train's ``LoggingConfig`` silences the forwarded lines, so they are
told apart where they are printed: a line that is the project's ``[area] message`` reaches the
terminal without Ray's prefix; every other line goes to the log file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
import threading
from pathlib import Path
from typing import TextIO

from orchestrator.core.execution import input_error_in
from orchestrator.core.interrupts import Interrupted
from workloads.core.errors import InputError
from workloads.core.logs import get_logger

log = get_logger("run")

RUN_LOG = "run.log"  # in `run`'s --storage, beside the checkpoints

# How Ray prints a forwarded line (ray._private.worker.print_worker_logs): an optionally coloured
# ``(Name pid=N, ip=A)`` and a space. Ray offers no public hook to filter the lines it forwards.
_RAY_PREFIX = re.compile(r"^(?:\x1b\[[\d;]*m)?\([^()]*pid=[^()]*\)(?:\x1b\[[\d;]*m)? ")
_PROJECT_LINE = re.compile(r"^\[[\w.-]+\] ")  # workloads.core.logs.AreaFormatter: ``[area] message``


class RayOutput(io.TextIOBase):
    """A text stream that sends each whole line written to it to ``terminal`` when it is one of
    the project's lines (Ray's prefix removed), else to ``log_file``, opened on its first line."""

    def __init__(self, log_file: Path, terminal: TextIO):
        self.log_file, self.terminal = log_file, terminal
        self.sink: TextIO | None = None
        self._pending = ""
        self._lock = threading.Lock()  # Ray's log thread and the driver's own writes

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            *lines, self._pending = (self._pending + text).split("\n")
            for line in lines:
                self._route(line)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self.sink is not None:
                self.sink.flush()

    def close_log(self) -> None:
        with self._lock:
            if self._pending:
                self._route(self._pending)
                self._pending = ""
            if self.sink is not None and self.sink is not self.terminal:
                self.sink.close()

    def _route(self, line: str) -> None:
        message = _RAY_PREFIX.sub("", line, count=1)
        if _PROJECT_LINE.match(message):
            print(message, file=self.terminal, flush=True)
        else:
            print(line, file=self._log())

    def _log(self) -> TextIO:
        if self.sink is None:
            try:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                self.sink = open(self.log_file, "a", buffering=1)
            except OSError as exc:  # nowhere to keep it: Ray's output stays on the terminal, nothing is lost
                log.warning("Ray's own output cannot go to %s (%s): it stays here", self.log_file, exc.strerror or exc)
                self.sink = self.terminal
            else:
                log.info("Ray's own output goes to %s (-v shows it here)", self.log_file)
        return self.sink


def _ray_stream_handlers() -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "ray" or name.startswith("ray.")]
    return [handler for logger in loggers for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)]


@contextlib.contextmanager
def ray_output_to(log_file: Path | None):
    """While the block runs, Ray's and Train's own output (forwarded worker lines, Ray's driver
    loggers) goes to ``log_file``, the project's lines to the terminal; None leaves everything on
    the terminal (``--verbose``). Ray is shut down before the block ends, so that no late
    forwarded line reaches the terminal."""
    if log_file is None:
        yield
        return
    terminal = sys.stderr
    output = RayOutput(log_file, terminal)
    saved = [(handler, handler.stream) for handler in _ray_stream_handlers()]
    for handler, _ in saved:
        handler.setStream(output)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            try:
                yield
            finally:
                _shutdown_ray()
    except BaseException as exc:
        if output.sink not in (None, terminal) and _unexpected(exc):  # a worker's traceback is in the file
            log.error("Ray's own output, with any worker's traceback, is in %s", log_file)
        raise
    finally:
        for handler, stream in saved:
            handler.setStream(stream)
        for handler in _ray_stream_handlers():  # those Ray made inside the block (imported there)
            if handler.stream is output:
                handler.setStream(terminal)
        output.close_log()


def _shutdown_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:
        ray.shutdown()  # (it prints Ray's last deduplicated lines: into the file)
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - a Ray going down (or a second Ctrl-C) hides no error
        log.debug("ray.shutdown failed", exc_info=True)


def _unexpected(exc: BaseException) -> bool:
    """Not a Ctrl-C, and not bad input (a worker's ``InputError`` is one line on the terminal)."""
    return not isinstance(exc, (KeyboardInterrupt, Interrupted, InputError)) and input_error_in(exc) is None
