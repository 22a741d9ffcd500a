"""Operator controls: pause and resume queues, set their limits, quiet and stop worker processes, requeue orphaned running tasks.

A running task is **orphaned** when its worker is known gone (its last heartbeat is older
than `worker_timeout`, or it has none and the lease is older than that: a worker's first
heartbeat goes out as it starts) or its lease is overdue (the deadline, the running
segment's score, is past on the server's clock). The same rule the requeue script applies,
so "requeue all orphaned" never moves a task it flagged that the script would then skip,
and never moves a live lease (the script checks again, atomically, without force).

A server that restarted restores every heartbeat as it was before the outage, so until it
has been up `worker_timeout` + `socket_timeout` (the time a live worker needs to store its
next one, as the broker's recovery waits) an old heartbeat proves nothing: no worker with one
is gone, only overdue leases are orphaned, and the result says how long to wait.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..backends.tooling.controls import WORKER_COMMANDS, LimitState
from ..base import PausedQueue, Segment
from ..limits import LimitError, QueueLimit, parse_concurrency, parse_rate
from .actions import Requeued
from .queues import NO_FILTER, Filter, SegmentPage, get_backend

#: Most running tasks a lease filter or "requeue all orphaned" reads; past it, counts are lower bounds.
ORPHAN_SCAN_LIMIT = 5_000
#: What a running view's `?lease=` filter may be.
LEASE_FLAGS = ("gone", "overdue")

__all__ = ["LEASE_FLAGS", "ORPHAN_SCAN_LIMIT", "WORKER_COMMANDS", "LeaseCheck", "LimitError", "LimitState"]


def paused_queues(alias: str) -> dict[str, PausedQueue]:
    """Return a backend's paused queues: name -> who paused it and since when."""
    return get_backend(alias).paused_queues()


def pause_queue(alias: str, queue_name: str, *, by: str) -> bool:
    """Stop workers acquiring a queue's tasks (enqueues still land); False when it was paused already."""
    return get_backend(alias).pause(queue_name, by=by)


def resume_queue(alias: str, queue_name: str) -> bool:
    """Let workers acquire a queue's tasks again; False when it was not paused."""
    return get_backend(alias).resume(queue_name)


def set_queue_limit(
    alias: str, queue_name: str, *, concurrency: int | str | None = None, rate: str | None = None, by: str
) -> QueueLimit:
    """Set a queue's runtime concurrency and/or rate ("N/s|m|h"), which win over the settings'; return the limits in force.

    Raises LimitError naming what is wrong: a bad value, an unknown queue, or a limit below the partition count.
    """
    backend = get_backend(alias)
    _known(backend, queue_name)
    return backend.set_limit(
        queue_name,
        concurrency=None if concurrency is None else parse_concurrency(concurrency),
        rate=None if rate is None else parse_rate(rate),
        by=by,
    )


def clear_queue_limit(alias: str, queue_name: str) -> bool:
    """Clear a queue's runtime limits, so the settings' apply again; False when none was set."""
    backend = get_backend(alias)
    _known(backend, queue_name)
    return backend.clear_limit(queue_name)


def queue_limits(alias: str, queue_names: Sequence[str] | None = None) -> dict[str, LimitState]:
    """Return each queue's limits (setting, runtime, in force) and whether they hold ready tasks back now."""
    backend = get_backend(alias)
    return backend.queue_limits(backend.queue_names() if queue_names is None else list(queue_names))


def _known(backend, queue_name: str) -> None:
    known = backend.queue_names()
    if queue_name not in known:
        raise LimitError(f"Unknown queue {queue_name!r}; backend {backend.alias!r} has {', '.join(known)}.")


def live_worker_documents(alias: str) -> list[dict[str, Any]]:
    """Return the last heartbeat document of each live worker process of a backend."""
    return get_backend(alias).live_workers()


def command_workers(alias: str, workers: Sequence[str], command: str, *, by: str) -> None:
    """Ask worker processes (by worker name) to be quiet or to stop; the command waits in Redis until taken."""
    get_backend(alias).send_control(list(workers), command, by=by)


def pending_commands(alias: str) -> dict[str, dict[str, Any]]:
    """Return the worker commands not yet taken: worker name -> {"command", "by", "at"}."""
    return get_backend(alias).pending_control()


@dataclass(frozen=True, slots=True)
class LeaseCheck:
    """What tells a running task's lease apart: the server's clock, the heartbeats and the worker timeout.

    `uptime_s` and `settle_s`: while the server holding the heartbeats has been up less than
    `settle_s`, a worker that has a heartbeat is not gone however old it is (see the module).
    """

    now: float
    heartbeats: dict[str, float]
    worker_timeout: float
    uptime_s: float = math.inf
    settle_s: float = 0.0

    @property
    def settles_in_s(self) -> float:
        """Seconds until an old heartbeat means a gone worker again: 0 unless the server restarted that recently."""
        return max(0.0, self.settle_s - self.uptime_s)

    def worker_gone(self, worker: str, lease_started_at: datetime | None = None) -> bool:
        """Return whether a worker's heartbeat is older than the timeout, or it has none and the lease is as old."""
        return self._silent(worker, lease_started_at) and not (self.settles_in_s and worker in self.heartbeats)

    def held_back(self, worker: str) -> bool:
        """Return whether a worker's heartbeat is older than the timeout but the server is too freshly up to tell."""
        return bool(self.settles_in_s) and worker in self.heartbeats and self._silent(worker)

    def _silent(self, worker: str, lease_started_at: datetime | None = None) -> bool:
        if not worker:
            return False
        beat = self.heartbeats.get(worker)
        if beat is None:
            beat = None if lease_started_at is None else lease_started_at.timestamp()
        return beat is not None and beat < self.now - self.worker_timeout

    def overdue(self, deadline: datetime | None) -> bool:
        return deadline is not None and deadline.timestamp() < self.now

    def flags(self, item) -> set[str]:
        """Return which of LEASE_FLAGS a running task carries ("gone", "overdue"), none for a healthy lease."""
        out = set()
        if self.worker_gone(getattr(item, "lease_worker", "") or "", getattr(item, "lease_started_at", None)):
            out.add("gone")
        if self.overdue(getattr(item, "lease_deadline", None)):
            out.add("overdue")
        return out


def lease_check(alias: str) -> LeaseCheck:
    """Return the lease check of a backend as of now on its server's clock, in one round trip."""
    backend = get_backend(alias)
    reading, options = backend.heartbeat_reading(), backend.config
    return LeaseCheck(reading.now, reading.beats, options.worker_timeout, reading.uptime_s, options.heartbeat_settle)


def _running(alias: str, queue_name: str):
    page = get_backend(alias).peek(queue_name, segment=Segment.RUNNING, count=ORPHAN_SCAN_LIMIT)
    return page.items, page.total <= ORPHAN_SCAN_LIMIT


def flagged_page(
    alias: str,
    queue_name: str,
    flag: str,
    offset: int,
    count: int,
    where: Filter = NO_FILTER,
    newest_first: bool = False,
) -> SegmentPage:
    """Return one page of the running tasks carrying `flag` ("gone" or "overdue"), among the first scanned."""
    if flag not in LEASE_FLAGS:
        raise ValueError(f"The lease filter is one of {', '.join(LEASE_FLAGS)}, not {flag[:20]!r}.")
    check = lease_check(alias)
    items, exact = _running(alias, queue_name)
    matching = [item for item in items if flag in check.flags(item) and where.matches(item)]
    if newest_first:
        matching.reverse()
    return SegmentPage(matching[offset : offset + count], len(matching), exact)


def orphaned(alias: str, queue_name: str) -> list[str]:
    """Return the ids of the running tasks whose worker is gone or whose lease is overdue, among the first scanned."""
    check = lease_check(alias)
    return [item.id for item in _running(alias, queue_name)[0] if check.flags(item)]


def requeue_orphaned(alias: str, queue_name: str) -> Requeued:
    """Requeue every orphaned running task of a queue in one script, never forced: a live lease stays.

    Right after a server restart the tasks whose worker has an old heartbeat stay where they
    are: the result lists them as `held_back`, with when to try again.
    """
    check = lease_check(alias)
    items = _running(alias, queue_name)[0]
    ids = [item.id for item in items if check.flags(item)]
    moved = get_backend(alias).requeue_many(queue_name, segment=Segment.RUNNING, task_ids=ids) if ids else []
    left, flagged = set(moved), set(ids)
    held = [i.id for i in items if i.id not in flagged and check.held_back(getattr(i, "lease_worker", "") or "")]
    if not held:
        return Requeued(moved, [i for i in ids if i not in left])
    return Requeued(moved, [i for i in ids if i not in left], held, check.uptime_s, check.settles_in_s)
