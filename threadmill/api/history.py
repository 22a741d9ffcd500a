"""A queue's per-minute history (tasks in, out, failed, and latency) as the console charts it.

`charted` is the overview's read: the last hour per minute and the last 24 hours per quarter-hour,
aligned to the clock's quarters (:00, :15, :30, :45), the older ones read from one summary each.
"""

from __future__ import annotations

from dataclasses import dataclass

from .queues import get_backend

#: Minutes of history a queue keeps, and the longest window a chart shows.
DAY_MINUTES = 24 * 60


@dataclass(frozen=True, slots=True)
class History:
    """Per-bucket series, oldest first: tasks enqueued, finished (either outcome), failed, and latency in seconds."""

    enqueued: list[int]
    finished: list[int]
    failed: list[int]
    latency_s: list[float | None]

    def last(self, buckets: int) -> History:
        """Return the newest `buckets` of each series."""
        return History(*(series[-buckets:] for series in self._series()))

    def rebucket(self, size: int) -> History:
        """Return the series in buckets of `size`: counts summed, latency the largest known (None where none is)."""
        chunks = range(0, len(self.enqueued), size)
        counts = (self.enqueued, self.finished, self.failed)
        enqueued, finished, failed = ([sum(series[i : i + size]) for i in chunks] for series in counts)
        known = [[v for v in self.latency_s[i : i + size] if v is not None] for i in chunks]
        return History(enqueued, finished, failed, [max(values) if values else None for values in known])

    def _series(self) -> tuple[list, ...]:
        return (self.enqueued, self.finished, self.failed, self.latency_s)


def history(alias: str, queue_name: str, *, minutes: int = DAY_MINUTES, now: float | None = None) -> History:
    """Return a queue's history per minute over the last `minutes` (at most 24 hours), in one round trip."""
    found = get_backend(alias).history(queue_name, minutes=minutes, now=now)
    return History(found["enqueued"], found["finished"], found["failed"], found["latency_s"])


def charted(alias: str, queue_name: str, *, now: float | None = None) -> tuple[History, History]:
    """Return a queue's last hour per minute and its last 24 hours per clock-aligned quarter-hour, the open one last."""
    found = get_backend(alias).charted(queue_name, now=now)
    hour, day = found["hour"], found["day"]
    return (
        History(hour["enqueued"], hour["finished"], hour["failed"], hour["latency_s"]),
        History(day["enqueued"], day["finished"], day["failed"], day["latency_s"]),
    )
