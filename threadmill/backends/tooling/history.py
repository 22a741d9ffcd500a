"""The backend's half of `threadmill.api.history`: a queue's per-minute counters, read as series.

Tasks in, out and failed, and the latency brokers sampled, each minute; the counters live 25
hours, so a series reaches back `HISTORY_MINUTES` at most. One MGET a partition, summed.
"""

from __future__ import annotations

import time

from ..errors import translate_errors
from .host import ToolingHost

#: Longest history a queue keeps, minutes (its per-minute counters live 25 hours).
HISTORY_MINUTES = 24 * 60


class HistoryTooling(ToolingHost):
    """Reading a queue's per-minute series: its history, and its throughput."""

    @translate_errors
    def history(self, queue_name: str, *, minutes: int = 60, now: float | None = None) -> dict[str, list]:
        """Return a queue's per-minute history, oldest first, up to 24 hours.

        Series: tasks `enqueued`, `finished` (either outcome), `failed`, and `latency_s`, the oldest
        ready task's largest age sampled by a broker that minute (None where none was sampled).
        """
        minutes = max(1, min(minutes, HISTORY_MINUTES))
        current = int((time.time() if now is None else now) // 60)
        span = range(current - minutes + 1, current + 1)
        series = ("ingress", "egress", "failed", "latency")
        sums = {name: [0] * minutes for name in series[:3]}
        latency: list[int | None] = [None] * minutes
        for partition in self.covered_partitions():
            keys = self.keys_for(partition)
            values = self.client.mget([keys.throughput(queue_name, name, m) for name in series for m in span])
            for i, name in enumerate(series[:3]):
                sums[name] = [a + int(v or 0) for a, v in zip(sums[name], values[i * minutes : (i + 1) * minutes])]
            for i, v in enumerate(values[3 * minutes :]):
                if v is not None:
                    latency[i] = max(int(v), latency[i] or 0)
        return {
            "enqueued": sums["ingress"],
            "finished": sums["egress"],
            "failed": sums["failed"],
            "latency_s": [None if v is None else v / 1000 for v in latency],
        }

    @translate_errors
    def throughput(self, queue_name: str, *, minutes: int = 60, now: float | None = None) -> dict[str, list[int]]:
        """Return tasks in (`ingress`) and out (`egress`) of a queue per minute, oldest first."""
        current = int((time.time() if now is None else now) // 60)
        span = range(current - minutes + 1, current + 1)
        values = [0] * (2 * minutes)
        for partition in self.covered_partitions():
            keys = self.keys_for(partition)
            names = [keys.throughput(queue_name, d, m) for d in ("ingress", "egress") for m in span]
            values = [a + int(v or 0) for a, v in zip(values, self.client.mget(names), strict=True)]
        return {"ingress": values[:minutes], "egress": values[minutes:]}
