"""Ctrl-C and SIGTERM: stop within seconds, keep what was done, say so, never report it as complete.

A command runs its long steps under :func:`interruptible`. The first SIGINT or SIGTERM sets the
interruption flag and raises :class:`KeyboardInterrupt` where the command is, except while a
step has said it stops gracefully (:meth:`Interruption.graceful`: a Ray Tune search, which ends
its trials and returns): then the flag is set and the step is asked to stop. A second signal
always raises at once. The command then marks what did not finish (MLflow ``KILLED`` with the
tag :data:`INTERRUPTED_TAG`), and the CLI prints one line saying what is kept and exits with
:data:`EXIT_INTERRUPTED` (128 + SIGINT, the shell's convention).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger("rerank_lab.interrupt")

EXIT_INTERRUPTED = 130


class Interrupted(Exception):
    """A command stopped by Ctrl-C or SIGTERM; ``summary`` says what was kept."""

    def __init__(self, summary: str):
        super().__init__(summary)
        self.summary = summary


class Interruption:
    """The flag of one command's interruption, and how the current step stops."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._graceful: Callable[[], None] | None = None

    def is_set(self) -> bool:
        return self.event.is_set()

    def __reduce__(self):
        # Tune pickles its searcher, stopper and callbacks to save its experiment state; a copy
        # outside this process has no signals to watch: it starts unset.
        return (Interruption, ())

    @contextlib.contextmanager
    def graceful(self, stop: Callable[[], None]) -> Iterator[None]:
        """While the block runs, the first signal calls ``stop`` (which must make the block return
        soon) instead of raising."""
        self._graceful = stop
        try:
            yield
        finally:
            self._graceful = None

    def _handle(self, signum: int, frame) -> None:
        first = not self.event.is_set()
        self.event.set()
        if first and self._graceful is not None:
            log.warning("interrupted: stopping the running trials (what finished is kept; Ctrl-C again to stop at once)")
            self._graceful()
            return
        raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible() -> Iterator[Interruption]:
    """Handle SIGINT and SIGTERM in the block (main thread only; elsewhere the block runs as is)."""
    interruption = Interruption()
    if threading.current_thread() is not threading.main_thread():
        yield interruption
        return
    previous = {sig: signal.signal(sig, interruption._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interruption
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["EXIT_INTERRUPTED", "Interrupted", "Interruption", "interruptible"]
