"""The sweep's live progress display: cells and trials done / running / failed, elapsed, ETA.

On a terminal it is one line rewritten in place; otherwise (CI, a file) a line is printed
whenever a trial ends. It writes to the stream the process had when it started, so it
stays visible while Ray's own output is sent to the sweep's log file.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class SweepProgress:
    def __init__(self, sweep: str, finished_per_cell: dict[str, int], trials_per_cell: int, enabled: bool = True,
                 stream: TextIO | None = None):
        self.sweep = sweep
        self.trials_per_cell = trials_per_cell
        self.finished = dict(finished_per_cell)  # cell -> trials ended (complete or failed)
        self.running: dict[str, int] = {}
        self.failed = 0
        self.epochs = 0
        self.walls: list[float] = []
        self.concurrency = 1
        self.enabled = enabled
        self._stream = stream  # None: the process's own stderr, looked up when written
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._shown = False

    @property
    def stream(self) -> TextIO:
        # Not kept as an attribute: Tune pickles its callbacks (with this display) when the
        # sweep starts, and cloudpickle pickles only sys.stdout and sys.stderr themselves,
        # which, while Ray's output goes to the log file, sys.__stderr__ is not.
        return self._stream or sys.__stderr__

    # events (from the driver's Tune callback)
    def trial_started(self, cell: str) -> None:
        self.running[cell] = self.running.get(cell, 0) + 1
        self._show()

    def epoch_done(self) -> None:
        self.epochs += 1
        if self.tty:
            self._show()

    def trial_seconds(self, seconds: float) -> None:
        self.walls.append(seconds)

    def trial_ended(self, cell: str, failed: bool) -> None:
        self.running[cell] = max(0, self.running.get(cell, 0) - 1)
        self.finished[cell] = self.finished.get(cell, 0) + 1
        self.failed += int(failed)
        self._show(force_line=True)

    # rendering
    def line(self) -> str:
        total = self.trials_per_cell * len(self.finished)
        done = sum(self.finished.values())
        running = sum(self.running.values())
        cells_done = sum(1 for n in self.finished.values() if n >= self.trials_per_cell)
        elapsed = time.perf_counter() - self.started
        eta = "?"
        if self.walls:
            eta = _clock(sum(self.walls) / len(self.walls) * (total - done) / max(1, self.concurrency))
        return (f"[sweep] {self.sweep}: cells {cells_done}/{len(self.finished)} done | trials {done}/{total} done, "
                f"{running} running, {self.failed} failed | elapsed {_clock(elapsed)}, ETA {eta}")

    def _show(self, force_line: bool = False) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r\x1b[2K" + self.line())
            self._shown = True
        elif force_line:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
