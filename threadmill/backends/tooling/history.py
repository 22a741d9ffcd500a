"""The backend's half of `threadmill.api.history`: a queue's per-minute counters, read as series.

Tasks in, out and failed, and the latency brokers sampled, each minute; the counters live 25
hours, so a series reaches back `HISTORY_MINUTES` at most. One MGET a partition, summed.

The charts' read (`charted`) costs ~330 keys a queue and partition instead of a day's 5,760: the
last hour per minute, and each older quarter-hour from one summary key (`summarise_quarters.lua`)
that the first read missing it stores. A summary only ever adds a key: the minute counters stay
as they are, so a previous release reads and writes exactly what it did.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import reduce

from ..errors import translate_errors
from ..keys import QUARTER_MINUTES, THROUGHPUT_SERIES
from .host import ToolingHost

#: Longest history a queue keeps, minutes (its per-minute counters live 25 hours).
HISTORY_MINUTES = 24 * 60
#: Minutes the charts show per minute; older ones are shown per quarter-hour.
HOUR_MINUTES = 60
#: Quarter-hours the 24-hour chart shows: the open one and the 95 closed before it.
DAY_QUARTERS = HISTORY_MINUTES // QUARTER_MINUTES
#: Minutes a quarter must have been closed, by the server's clock, before its summary is stored: a
#: counter's key names its writer's minute, so a lagging clock or a slow call may still add to it.
SUMMARY_GRACE_MINUTES = 30

#: One bucket's counts: tasks in, out, failed, and the largest latency sampled in ms (None: none was).
Bucket = tuple[int, int, int, int | None]
#: A bucket nothing was counted in.
EMPTY: Bucket = (0, 0, 0, None)


def merge(a: Bucket, b: Bucket) -> Bucket:
    """Return two buckets as one: counts summed, latency the larger known."""
    latency = b[3] if a[3] is None else a[3] if b[3] is None else max(a[3], b[3])
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], latency)


def read_summary(summary: bytes | None) -> Bucket | None:
    """Return the bucket a quarter's summary ("in,out,failed,latency_ms") stores, None where it is missing or unreadable."""
    try:
        enqueued, finished, failed, latency = (summary or b"").decode().split(",")
        return (int(enqueued), int(finished), int(failed), int(latency) if latency else None)
    except (UnicodeDecodeError, ValueError):
        return None


def minute_buckets(values: Sequence[bytes | None], minutes: int) -> list[Bucket]:
    """Return per-minute buckets from one MGET of `minutes` counters of each series, series after series."""
    counts = [[int(v or 0) for v in values[i * minutes : (i + 1) * minutes]] for i in range(3)]
    latency = [None if v is None else int(v) for v in values[3 * minutes : 4 * minutes]]
    return list(zip(*counts, latency, strict=True))


def as_series(buckets: Sequence[Bucket]) -> dict[str, list]:
    """Return buckets as the series `history` returns, latency in seconds."""
    return {
        "enqueued": [b[0] for b in buckets],
        "finished": [b[1] for b in buckets],
        "failed": [b[2] for b in buckets],
        "latency_s": [None if b[3] is None else b[3] / 1000 for b in buckets],
    }


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

    @translate_errors
    def charted(self, queue_name: str, *, now: float | None = None) -> dict[str, dict[str, list]]:
        """Return a queue's last hour per minute (`hour`) and last 24 hours per clock-aligned quarter-hour (`day`).

        Both hold the series `history` returns, oldest first; `day` ends with the open quarter. Exact
        where a summary is missing too: that quarter is summed from its minute counters.
        """
        current = int((time.time() if now is None else now) // 60)
        hour_start = current - HOUR_MINUTES + 1
        open_quarter = current - current % QUARTER_MINUTES
        quarters = range(open_quarter - (DAY_QUARTERS - 1) * QUARTER_MINUTES, open_quarter + 1, QUARTER_MINUTES)
        hour, day = [EMPTY] * HOUR_MINUTES, [EMPTY] * DAY_QUARTERS
        for partition in self.covered_partitions():
            minutes, summarised = self._charted_partition(partition, queue_name, hour_start, quarters)
            hour = [merge(a, b) for a, b in zip(hour, minutes, strict=True)]
            recent = (minutes[q - hour_start : q - hour_start + QUARTER_MINUTES] for q in quarters[len(summarised) :])
            buckets = [*summarised, *(reduce(merge, m, EMPTY) for m in recent)]
            day = [merge(a, b) for a, b in zip(day, buckets, strict=True)]
        return {"hour": as_series(hour), "day": as_series(day)}

    def _charted_partition(
        self, partition: int, queue_name: str, hour_start: int, quarters: range
    ) -> tuple[list[Bucket], list[Bucket]]:
        """Return one partition's last hour per minute, and its quarters that start before that hour."""
        keys = self.keys_for(partition)
        older = [q for q in quarters if q < hour_start]
        span = range(hour_start, hour_start + HOUR_MINUTES)
        names = [keys.quarter(queue_name, q) for q in older]
        names += [keys.throughput(queue_name, series, m) for series in THROUGHPUT_SERIES for m in span]
        values = self.client.mget(names)
        summaries = {q: read_summary(v) for q, v in zip(older, values[: len(older)], strict=True)}
        missing = [q for q in older if summaries[q] is None]
        if missing:
            found = self.scripts_for(partition).summarise_quarters(queue_name, missing, SUMMARY_GRACE_MINUTES)
            summaries |= {q: read_summary(v) for q, v in zip(missing, found, strict=True)}
        minutes = minute_buckets(values[len(older) :], HOUR_MINUTES)
        return minutes, [summaries[q] or EMPTY for q in older]
