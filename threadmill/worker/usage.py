"""What a worker process's snapshot says it uses: its share of a CPU since the last look, and its resident memory.

On Linux both come from the standard library (`os.times`, `/proc/self/statm`), read as psutil
reads them there; importing psutil instead cost every worker's start 9 ms. Elsewhere psutil
answers, imported at the first reading.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

#: Where Linux keeps this process's memory in pages: size, resident, shared, ...
STATM = Path("/proc/self/statm")


class ProcessUsage:
    """Readings of this process's CPU and memory; `cpu_percent` counts from the previous call, as psutil's does."""

    def __init__(self) -> None:
        self._cpu_s, self._at = self._cpu_now()
        self._psutil = None if STATM.exists() else _psutil_process()

    @staticmethod
    def _cpu_now() -> tuple[float, float]:
        times = os.times()
        return times.user + times.system, time.monotonic()

    def cpu_percent(self) -> float:
        """Return the CPU this process used since the last call (or since it was made), in percent of one CPU."""
        cpu_s, at = self._cpu_now()
        used, elapsed = cpu_s - self._cpu_s, at - self._at
        self._cpu_s, self._at = cpu_s, at
        return round(100.0 * used / elapsed, 1) if elapsed > 0 else 0.0

    def rss_bytes(self) -> int:
        """Return this process's resident set size, bytes."""
        if self._psutil is not None:
            return self._psutil.memory_info().rss
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _psutil_process():
    import psutil

    return psutil.Process()
