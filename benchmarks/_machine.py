"""What the machine did over a benchmark: its CPU time, read the same way by every benchmark."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds() -> tuple[float, float]:
    """(busy, idle) core-seconds of all cores since boot, from /proc/stat. Steal (time the
    hypervisor gave to other guests) is neither: it is not work done here, nor time offered."""
    user, nice, system, idle, iowait, irq, softirq, *_ = map(int, Path("/proc/stat").read_text().split()[1:11])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, (idle + iowait) / hz
