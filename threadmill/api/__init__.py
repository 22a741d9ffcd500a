"""The tooling API: what the console (or a script) reads and does to queues, through the backend.

The role Sidekiq's `api.rb` plays for its web UI: the console never builds a Redis key and
never imports `redis`; every read and every action goes through here. Each action that
touches several tasks is one Lua script (or one script per bounded window), so a crash
cannot lose a task between two writes. Worker snapshots arrive on the telemetry channel;
one `TelemetryHub` per process holds one subscription and fans events out to listeners.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist

from ..backends.base import REQUEUEABLE_SEGMENTS, Segment, UnreadableTask
from ..backends.redis import RedisTaskBackend
from .workers import TelemetryHub, WorkerSnapshot, hub

logger = logging.getLogger("threadmill.api")

__all__ = [
    "REQUEUEABLE_SEGMENTS",
    "Filter",
    "QueueSummary",
    "Segment",
    "TaskResultDoesNotExist",
    "TelemetryHub",
    "UnreadableTask",
    "WorkerSnapshot",
    "backend_aliases",
    "get_backend",
    "hub",
]

#: Most segment entries a filtered view scans; past it, its count is a lower bound.
FILTER_SCAN_LIMIT = 100_000
#: Points in a throughput sparkline, one per minute.
SPARKLINE_MINUTES = 60

# Matched with fullmatch: a `$` anchor would also pass a path with a trailing newline.
_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def backend_aliases() -> list[str]:
    """Return the aliases of every configured threadmill backend, in settings order."""
    from django.conf import settings

    return [alias for alias in settings.TASKS if isinstance(task_backends[alias], RedisTaskBackend)]


def get_backend(alias: str) -> RedisTaskBackend:
    """Return the threadmill backend of `alias`; LookupError when there is none."""
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        raise LookupError(f"No task backend is configured as {alias!r}.") from None
    if not isinstance(backend, RedisTaskBackend):
        raise LookupError(f"The task backend {alias!r} is not a threadmill backend.")  # noqa: TRY004 - a lookup, not a type check
    return backend


def has_queue(alias: str, queue_name: str) -> bool:
    """Return whether a backend knows the queue (configured, or a task was ever enqueued on it)."""
    return queue_name in get_backend(alias).queue_names()


# -- reading segments ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filter:
    """A segment view's filter: a task path and an error class path, each optional."""

    task_path: str = ""
    error_class: str = ""

    def __post_init__(self) -> None:
        for name, value in (("task path", self.task_path), ("error class", self.error_class)):
            if value and (len(value) > 200 or not _DOTTED_PATH.fullmatch(value)):
                raise ValueError(f"The {name} filter must be a dotted Python path, such as 'myapp.tasks.send'.")

    def __bool__(self) -> bool:
        return bool(self.task_path or self.error_class)

    @property
    def needles(self) -> list[str]:
        """The exact JSON fragments a matching stored document contains."""
        out = []
        if self.task_path:
            out.append(f'"path":{json.dumps(self.task_path)}')
        if self.error_class:
            out.append(f'"exception_class_path":{json.dumps(self.error_class)}')
        return out


#: The filter of an unfiltered view.
NO_FILTER = Filter()


@dataclass(frozen=True, slots=True)
class SegmentPage:
    """One page of a (possibly filtered) segment: rows, total, and whether the total is exact."""

    items: list
    total: int
    exact: bool = True


def page(
    alias: str,
    queue_name: str,
    segment: Segment,
    offset: int,
    count: int,
    where: Filter = NO_FILTER,
    newest_first: bool | None = None,
) -> SegmentPage:
    """Return one page of a segment, filtered or not, with its total, in one round trip.

    `newest_first` None keeps the segment's natural order (finished segments newest first).
    """
    found, complete = get_backend(alias).peek_matching(
        queue_name,
        segment=segment,
        needles=where.needles,
        offset=offset,
        count=count,
        scan_limit=FILTER_SCAN_LIMIT,
        newest_first=newest_first,
    )
    return SegmentPage(found.items, found.total, complete)


def natural_newest_first(segment: Segment) -> bool:
    """Return whether a segment lists newest first by default (finished and unreadable ones do)."""
    return segment in (Segment.SUCCESSFUL, Segment.FAILED, Segment.UNREADABLE)


def task(alias: str, task_id: str):
    """Return one task (a task result, or an UnreadableTask); TaskResultDoesNotExist if none."""
    return get_backend(alias).peek_task(task_id)


# -- actions ---------------------------------------------------------------------------


def count_selected(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> int:
    """Return how many of the selected tasks are in the segment now."""
    return len(get_backend(alias).in_segment(queue_name, segment, task_ids))


def count_view(alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER) -> int:
    """Return how many tasks a (possibly filtered) segment view holds now."""
    return page(alias, queue_name, segment, 0, 1, where).total


def requeue(alias: str, task_id: str) -> bool:
    """Requeue one task by id, keeping its stored payload as it is (it may be unreadable)."""
    return get_backend(alias).requeue(task_id)


def requeue_selected(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> list[str]:
    """Requeue the selected tasks of a segment in one script; return the ids that moved."""
    return get_backend(alias).requeue_many(queue_name, segment=segment, task_ids=task_ids)


def requeue_view(alias: str, queue_name: str, segment: Segment, where: Filter = NO_FILTER) -> list[str]:
    """Requeue every task of a (possibly filtered) segment view, one script per window; return the ids."""
    return get_backend(alias).requeue_matching(queue_name, segment=segment, needles=where.needles)


def delete(alias: str, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> list[str]:
    """Delete those selected tasks still in the segment, with their data and results, in one script."""
    backend = get_backend(alias)
    present = backend.in_segment(queue_name, segment, task_ids)
    backend.delete(present)
    return present


def purge(alias: str, queue_name: str, segment: Segment) -> int:
    """Delete a whole segment and the task data it owns; return how many tasks were removed."""
    return get_backend(alias).purge(queue_name, segment=segment)


# -- overview --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """Counts, latency, throughput and a status line for one queue of one backend."""

    alias: str
    queue_name: str
    counts: dict[Segment, int]
    latency_s: float | None
    ingress: list[int]
    egress: list[int]
    status: str
    status_level: str

    minute_elapsed: float = 0.0

    @property
    def ingress_per_minute(self) -> int:
        return sliding_minute(self.ingress, self.minute_elapsed)

    @property
    def egress_per_minute(self) -> int:
        return sliding_minute(self.egress, self.minute_elapsed)


def sliding_minute(per_minute: list[int], elapsed: float) -> int:
    """Estimate the count of the last 60 s from per-minute counters: this minute, plus the rest of the last."""
    if not per_minute:
        return 0
    previous = per_minute[-2] if len(per_minute) > 1 else 0
    return round(per_minute[-1] + previous * (1 - elapsed))


def overview(now: float | None = None) -> list[QueueSummary]:
    """Return a summary of every queue of every threadmill backend."""
    now = time.time() if now is None else now
    workers = hub().workers(now)
    out = []
    for alias in backend_aliases():
        backend = get_backend(alias)
        stats = backend.queue_stats()
        oldest = backend.oldest_ready_enqueued_at(list(stats))
        for queue_name, counts in stats.items():
            flow = backend.throughput(queue_name, minutes=SPARKLINE_MINUTES, now=now)
            latency = None if oldest[queue_name] is None else max(0.0, now - oldest[queue_name].timestamp())
            overdue = bool(counts[Segment.RUNNING]) and lease_overdue(alias, queue_name, now)
            status, level = queue_status(alias, queue_name, counts, workers, now, overdue)
            out.append(
                QueueSummary(
                    alias, queue_name, counts, latency, flow["ingress"], flow["egress"], status, level, (now % 60) / 60
                )
            )
    return out


def queue_status(
    alias: str,
    queue_name: str,
    counts: dict[Segment, int],
    workers: list[WorkerSnapshot],
    now: float,
    overdue: bool = False,
) -> tuple[str, str]:
    """Answer "why is nothing running?" for one queue: a sentence and a level (ok, warn, bad)."""
    if overdue:
        return "Leases overdue: a worker died holding tasks and no reaper has taken them back yet.", "bad"
    serving = [w for w in workers if w.state == "live" and w.serves(alias, queue_name)]
    ready = counts[Segment.READY]
    if not serving:
        if not hub().warmed_up(now):
            return "Waiting for worker telemetry.", "warn"
        return ("No live workers for this queue.", "bad") if ready else ("No live workers for this queue.", "warn")
    if ready and all(w.threads and w.busy >= w.threads for w in serving):
        return f"All {sum(w.threads for w in serving)} threads are busy.", "warn"
    return f"{len(serving)} live worker{'s' if len(serving) != 1 else ''}.", "ok"


def lease_overdue(alias: str, queue_name: str, now: float | None = None) -> bool:
    """Return whether the running task with the earliest lease deadline is past it."""
    running = get_backend(alias).peek(queue_name, segment=Segment.RUNNING, count=1)
    deadline = getattr(running.items[0], "lease_deadline", None) if running.items else None
    return deadline is not None and deadline.timestamp() < (time.time() if now is None else now)
