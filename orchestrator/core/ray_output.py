"""Ray's own output while ``orchestrate run`` trains: the project's lines on the terminal, Ray's
and Ray Train's in ``run.log`` beside the checkpoints (``--verbose``: all on the terminal).

Ray forwards every line a worker prints (``log_to_driver``) through its stdstream dispatcher,
to the handler it registers as ``ray_print_logs``, which prints each line with the process's
prefix (``(RayTrainWorker pid=1) ...``): the project's lines (``[train] epoch 1/2 ...``) and Ray
Train's (``Reporting training result 1: TrainingReport(...)`` with every metric, tracebacks
under load) alike. Train's ``LoggingConfig`` only lowers its own ``ray.train`` records and
nothing else Ray forwards, so that handler is replaced, on Ray's own hook, by one that tells
the lines apart: whole lines, handed over by Ray's log thread, written to the terminal or the
file (no stream is wrapped, so no write can come back into it). Ray's driver loggers keep
their warnings on the terminal and write everything to the file too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from orchestrator.core.interrupts import Interrupted
from workloads.core.errors import InputError
from workloads.core.logs import get_logger

log = get_logger("run")

RUN_LOG = "run.log"  # in `run`'s --storage, beside the checkpoints

_PROJECT_LINE = re.compile(r"^\[[\w.-]+\] ")  # workloads.core.logs.AreaFormatter: ``[area] message``
_RAY_HANDLER = "ray_print_logs"  # the name ray._private.worker.connect gives its handler (disconnect removes it)
_RAY_ITSELF = ("raylet", "autoscaler")  # the node's own warnings (a worker killed for memory): on the terminal


class WorkerLines:
    """Ray's handler of forwarded worker lines, routed: a project line reaches ``terminal``
    without Ray's prefix, any other line ``sink`` with it. Called on Ray's log thread."""

    def __init__(self, sink: TextIO, terminal: TextIO):
        from ray._private.ray_logging import (
            RAY_DEDUP_LOGS_AGG_WINDOW_S,
            RAY_DEDUP_LOGS_ALLOW_REGEX,
            RAY_DEDUP_LOGS_SKIP_REGEX,
            LogDeduplicator,
        )

        self.sink, self.terminal = sink, terminal
        self._lock = threading.Lock()  # Ray's log thread and the driver's flush at the end
        # Ray's own deduplication ("[repeated 2x across cluster]"), in instances of our own: Ray
        # flushes its shared ones at disconnect straight to the terminal
        windows = (RAY_DEDUP_LOGS_AGG_WINDOW_S, RAY_DEDUP_LOGS_ALLOW_REGEX, RAY_DEDUP_LOGS_SKIP_REGEX)
        self._dedup = {False: LogDeduplicator(*windows), True: LogDeduplicator(*windows)}

    def __call__(self, batch: dict) -> None:
        with self._lock:  # Ray's deduplication state only: the lines are written after, so a write can never wait on it
            batches = self._dedup[bool(batch.get("is_err"))].deduplicate(batch)
        for out in batches:
            self._write(out)

    def flush(self) -> None:
        """What Ray's deduplication still holds (once Ray's log thread has stopped)."""
        with self._lock:
            batches = [out for dedup in self._dedup.values() for out in dedup.flush()]
        for out in batches:
            self._write(out)
        self.sink.flush()

    def _write(self, batch: dict) -> None:
        if batch.get("pid") in _RAY_ITSELF:
            from ray._private.worker import print_worker_logs

            print_worker_logs(batch, self.terminal)  # (Ray's own filter of autoscaler events and format)
            return
        for line in batch.get("lines", ()):
            if _PROJECT_LINE.match(line):
                self.terminal.write(line + "\n")
                self.terminal.flush()
            else:
                self.sink.write(f"{_prefix(batch)} {line}\n")  # one write a line: whole lines beside Ray's loggers'


def _prefix(batch: dict) -> str:
    """Ray's ``(Name pid=N, ip=A)``, uncoloured (Ray's own printer colours it for a terminal)."""
    name = batch.get("actor_name") or batch.get("task_name")
    ip = "" if batch.get("ip") == batch.get("localhost") else f", ip={batch.get('ip')}"
    return f"({name + ' ' if name else ''}pid={batch.get('pid')}{ip})"


class _Routing:
    """One ``ray_output_to`` block: the file, opened once Ray starts, and what was changed in Ray."""

    def __init__(self, log_file: Path, terminal: TextIO):
        self.log_file, self.terminal = log_file, terminal
        self.sink: TextIO | None = None
        self.workers: WorkerLines | None = None
        self.raised: list[tuple[logging.Handler, int]] = []  # Ray's console handlers, their levels before
        self.file_handlers: list[tuple[logging.Logger, logging.Handler]] = []
        self.failed = False

    def attach(self) -> None:
        """Ray's driver loggers (once Ray is imported) and its worker lines (once it is connected)."""
        if self.failed or "ray" not in sys.modules:
            return
        if self.sink is None:
            try:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                self.sink = open(self.log_file, "a", buffering=1, encoding="utf-8")
            except OSError as exc:  # nowhere to keep it: Ray's output stays on the terminal, nothing is lost
                self.failed = True
                log.warning("Ray's own output cannot go to %s (%s): it stays here", self.log_file, exc.strerror or exc)
                return
            self.sink.write(f"---- orchestrate run, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            log.info("Ray's and Ray Train's own output goes to %s (-v shows it here)", self.log_file)
            self._attach_loggers()
        ray = sys.modules["ray"]
        if self.workers is None and ray.is_initialized():
            from ray._private.ray_logging import global_worker_stdstream_dispatcher

            self.workers = WorkerLines(self.sink, self.terminal)
            global_worker_stdstream_dispatcher.remove_handler(_RAY_HANDLER)
            global_worker_stdstream_dispatcher.add_handler(_RAY_HANDLER, self.workers)

    def _attach_loggers(self) -> None:
        to_file = logging.StreamHandler(self.sink)
        to_file.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
        for name in ["ray", *(n for n in list(logging.root.manager.loggerDict) if n.startswith("ray."))]:
            logger = logging.getLogger(name)
            consoles = [h for h in logger.handlers
                        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
            for handler in consoles:
                if all(handler is not seen for seen, _ in self.raised):  # one handler on two loggers: its level once
                    self.raised.append((handler, handler.level))
                handler.setLevel(max(handler.level, logging.WARNING))
            if consoles:
                logger.addHandler(to_file)
                self.file_handlers.append((logger, to_file))

    def detach(self, started_ray: bool) -> None:
        """Ray's own handlers back; a Ray started in the block ended first (its log thread then
        delivers every line still on its way, here, not after the command's last word)."""
        ray = sys.modules.get("ray")
        if self.workers is not None and ray is not None and ray.is_initialized():
            if started_ray:
                with contextlib.suppress(Exception, KeyboardInterrupt):  # a Ray going down hides no error
                    ray.shutdown()
            else:  # a Ray the caller keeps (in-process tests): its printer back
                from ray._private import worker
                from ray._private.ray_logging import global_worker_stdstream_dispatcher

                global_worker_stdstream_dispatcher.remove_handler(_RAY_HANDLER)
                ignore_prefix = worker._should_ignore_worker_log_prefix(worker.global_worker)
                global_worker_stdstream_dispatcher.add_handler(
                    _RAY_HANDLER, functools.partial(worker.print_to_stdstream, ignore_prefix=ignore_prefix))
        if self.workers is not None:
            self.workers.flush()
        for handler, level in self.raised:
            handler.setLevel(level)
        for logger, handler in self.file_handlers:
            logger.removeHandler(handler)
        if self.sink is not None:
            self.sink.close()


_active: _Routing | None = None


def attach() -> None:
    """Called by :func:`orchestrator.core.execution.init_ray` before and after ``ray.init``:
    inside a ``ray_output_to`` block, Ray's output from then on is routed."""
    if _active is not None:
        _active.attach()


@contextlib.contextmanager
def ray_output_to(log_file: Path | None, said_in_one_line: Callable[[BaseException], bool] = lambda exc: False):
    """While the block runs, Ray's and Train's own output (forwarded worker lines, Ray's driver
    loggers below warnings) goes to ``log_file``, the project's lines and Ray's warnings to the
    terminal; None leaves everything on the terminal (``--verbose``). The file is opened once
    Ray starts: a block that never starts Ray writes nothing. An error the block raises, but for
    Ctrl-C and what ``said_in_one_line`` (a worker's bad input), also says where the file is."""
    global _active
    if log_file is None:
        yield
        return
    ray = sys.modules.get("ray")
    started_ray = ray is None or not ray.is_initialized()
    routing = _active = _Routing(log_file, sys.stderr)
    if not started_ray:  # (else init_ray attaches, once Ray starts)
        routing.attach()
    failure = None
    try:
        yield
    except BaseException as exc:
        failure = exc
        raise
    finally:
        _active = None
        if routing.sink is not None:
            routing.detach(started_ray)
            said = failure is None or isinstance(failure, (KeyboardInterrupt, Interrupted, InputError)) or said_in_one_line(failure)
            if not said:  # a worker's traceback is in the file
                log.error("Ray's own output, with any worker's traceback, is in %s", log_file)
