"""The tooling API: what the console (or a script) reads and does to queues, through the backend.

The role Sidekiq's `api.rb` plays for its web UI: the console never builds a Redis key and
never imports `redis`; every read and every action goes through here. One module per concern:
`queues` (backends, queues, pages, one task), `actions` (counts, requeue, delete, purge, cancel),
`workers` (telemetry), `controls` (pause, worker commands, orphaned tasks), `schedules`,
`history` (per-minute series for charts), `metrics` (Prometheus), `workflows` (the list,
one workflow's graph and state, its cancel and retry); the overview lives here.
Each action that touches several tasks is one
Lua script (or one script per bounded window), so a crash cannot lose a task between two
writes. Worker snapshots arrive on the telemetry channel; one `TelemetryHub` per process
holds one subscription and fans events out to listeners.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from importlib.util import resolve_name
from typing import TYPE_CHECKING, Any

from django.tasks.exceptions import TaskResultDoesNotExist

from ..attempts import ATTEMPTS_KEPT, Timeline, timeline_of
from ..base import DELETABLE_SEGMENTS, REQUEUEABLE_SEGMENTS, WAITING_NOT_DELETABLE, PausedQueue, Segment, UnreadableTask
from ..identity import WorkerName
from ..limits import QueueLimit

if TYPE_CHECKING:
    from ..backends.cancelling import default_canceller
    from ..backends.merge import Cursor, KeysetPage
    from ..backends.tooling.actions import CancelOutcome
    from ..backends.tooling.controls import LimitState
    from ..backends.tooling.metrics import TaskLimitState
    from . import controls, history, metrics, schedules, workflows
    from .actions import (
        CANCEL_VIEW_LIMIT,
        CANCELLABLE_SEGMENTS,
        Cancelled,
        Requeued,
        cancel,
        cancel_selected,
        cancel_view,
        count_selected,
        count_view,
        delete,
        live_in_selection,
        live_in_view,
        purge,
        requeue,
        requeue_selected,
        requeue_view,
    )
    from .queues import (
        FILTER_SCAN_LIMIT,
        MEMORY_WARNING_SHARE,
        NO_FILTER,
        Filter,
        SegmentPage,
        ServerMemory,
        backend_aliases,
        decode_cursor,
        encode_cursor,
        get_backend,
        has_queue,
        is_partitioned,
        keyset_page,
        natural_newest_first,
        page,
        server_memory,
        task,
        unreachable_backends,
    )
    from .workers import TelemetryHub, WorkerSnapshot, hub, parse_worker_event

#: The concerns' modules, attributes of this package (`api.controls`) as they always were, imported at first use.
_SUBMODULES = frozenset({"actions", "controls", "history", "metrics", "queues", "schedules", "workers", "workflows"})
#: Each name re-exported from a concern's module, and that module, imported at first use: a worker's
#: start needs `queues` alone, and the other concerns' imports cost it about 25 ms.
_LAZY_NAMES: dict[str, str] = {
    "default_canceller": "..backends.cancelling",
    "Cursor": "..backends.merge",
    "KeysetPage": "..backends.merge",
    "CancelOutcome": "..backends.tooling.actions",
    "LimitState": "..backends.tooling.controls",
    "TaskLimitState": "..backends.tooling.metrics",
    "CANCEL_VIEW_LIMIT": ".actions",
    "CANCELLABLE_SEGMENTS": ".actions",
    "Cancelled": ".actions",
    "Requeued": ".actions",
    "cancel": ".actions",
    "cancel_selected": ".actions",
    "cancel_view": ".actions",
    "count_selected": ".actions",
    "count_view": ".actions",
    "delete": ".actions",
    "live_in_selection": ".actions",
    "live_in_view": ".actions",
    "purge": ".actions",
    "requeue": ".actions",
    "requeue_selected": ".actions",
    "requeue_view": ".actions",
    "FILTER_SCAN_LIMIT": ".queues",
    "MEMORY_WARNING_SHARE": ".queues",
    "NO_FILTER": ".queues",
    "Filter": ".queues",
    "SegmentPage": ".queues",
    "ServerMemory": ".queues",
    "backend_aliases": ".queues",
    "decode_cursor": ".queues",
    "encode_cursor": ".queues",
    "get_backend": ".queues",
    "has_queue": ".queues",
    "is_partitioned": ".queues",
    "keyset_page": ".queues",
    "natural_newest_first": ".queues",
    "page": ".queues",
    "server_memory": ".queues",
    "task": ".queues",
    "unreachable_backends": ".queues",
    "TelemetryHub": ".workers",
    "WorkerSnapshot": ".workers",
    "hub": ".workers",
    "parse_worker_event": ".workers",
}

if not TYPE_CHECKING:  # type checkers see the imports above, and typos stay errors

    def __getattr__(name: str) -> Any:
        """Import a re-exported name's module at its first use (PEP 562) and keep the name here."""
        if name in _SUBMODULES:
            return _imported(f".{name}")
        module = _LAZY_NAMES.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = globals()[name] = getattr(_imported(module), name)
        return value

    def _imported(module: str) -> Any:
        # `__import__`, as an import statement does: `python -X importtime` does not see importlib.import_module.
        return __import__(resolve_name(module, __name__), fromlist=["__name__"])

    def __dir__() -> list[str]:
        return sorted({*globals(), *_SUBMODULES, *_LAZY_NAMES})


logger = logging.getLogger("threadmill.api")

__all__ = [
    "ATTEMPTS_KEPT",
    "CANCELLABLE_SEGMENTS",
    "CANCEL_VIEW_LIMIT",
    "DELETABLE_SEGMENTS",
    "FILTER_SCAN_LIMIT",
    "MEMORY_WARNING_SHARE",
    "NO_FILTER",
    "REQUEUEABLE_SEGMENTS",
    "WAITING_NOT_DELETABLE",
    "CancelOutcome",
    "Cancelled",
    "Cursor",
    "Filter",
    "KeysetPage",
    "PausedQueue",
    "QueueSummary",
    "Requeued",
    "Segment",
    "SegmentPage",
    "ServerMemory",
    "TaskResultDoesNotExist",
    "TelemetryHub",
    "Timeline",
    "UnreadableTask",
    "WorkerName",
    "WorkerSnapshot",
    "backend_aliases",
    "cancel",
    "cancel_selected",
    "cancel_view",
    "controls",
    "count_selected",
    "count_view",
    "decode_cursor",
    "default_canceller",
    "delete",
    "encode_cursor",
    "get_backend",
    "has_queue",
    "history",
    "hub",
    "is_partitioned",
    "keyset_page",
    "known_workers",
    "live_in_selection",
    "live_in_view",
    "metrics",
    "natural_newest_first",
    "overview",
    "page",
    "parse_worker_event",
    "purge",
    "requeue",
    "requeue_selected",
    "requeue_view",
    "schedules",
    "server_memory",
    "status_report",
    "task",
    "timeline_of",
    "unreachable_backends",
    "workflows",
]

#: Points in a throughput sparkline, one per minute.
SPARKLINE_MINUTES = 60


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
    paused: PausedQueue | None = None
    #: The limits in force, in words ("3 at once, 100/m"), "" for none.
    limits: str = ""

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
    from .queues import backend_aliases, get_backend

    now = time.time() if now is None else now
    workers = known_workers(now)
    out = []
    for alias in backend_aliases():
        backend = get_backend(alias)
        stats = backend.queue_stats()
        oldest = backend.oldest_ready_enqueued_at(list(stats))
        paused = backend.paused_queues()
        limits = backend.queue_limits(list(stats))
        holding = backend.holding_task_limits()
        for queue_name, counts in stats.items():
            flow = backend.throughput(queue_name, minutes=SPARKLINE_MINUTES, now=now)
            latency = None if oldest[queue_name] is None else max(0.0, now - oldest[queue_name].timestamp())
            overdue = bool(counts[Segment.RUNNING]) and lease_overdue(alias, queue_name, now)
            pause = paused.get(queue_name)
            limit = limits.get(queue_name)
            status, level = queue_status(
                alias, queue_name, counts, workers, now, overdue, pause, limit, holding.get(queue_name, ())
            )
            ingress, egress, elapsed = flow["ingress"], flow["egress"], (now % 60) / 60
            out.append(
                QueueSummary(
                    alias, queue_name, counts, latency, ingress, egress, status, level, elapsed, paused=pause,
                    limits=limits_text(limit),
                )
            )  # fmt: skip
    return out


def status_report(alias: str, now: float) -> dict[str, Any]:
    """Return a backend's queues (counts, latency, pause, limits, whether a worker serves them) and live workers as JSON.

    What `threadmill status --json` prints: the command-line guide (docs/how-to/command-line.md) names each field.
    """
    from .queues import get_backend

    backend = get_backend(alias)
    stats = backend.queue_stats()
    oldest = backend.oldest_ready_enqueued_at(list(stats))
    paused = backend.paused_queues()
    workers = backend.live_workers()
    totals = backend.totals()
    limits = backend.queue_limits(list(stats))
    holding = backend.holding_task_limits()
    queues = []
    for name, counts in stats.items():
        serving = [w["worker"] for w in workers if name in w.get("queues", ())]
        pause = paused.get(name)
        held = holding.get(name, []) if counts[Segment.READY] else []
        queues.append(
            {
                "queue": name,
                **{segment.value: counts[segment] for segment in Segment},
                "latency_s": None if oldest[name] is None else round(max(0.0, now - oldest[name].timestamp()), 3),
                "paused": None if pause is None else {"by": pause.by, "since": pause.since.timestamp()},
                "workers": len(serving),
                "unserved": bool(counts[Segment.READY]) and not serving and pause is None,
                "totals": totals.get(name, {}),
                "limits": limits[name].limit.as_json(),
                "throttled": limits[name].throttled or bool(held),
                "throttle": _throttle(limits[name], held),
                "held_by_task_limits": [s.path for s in held],
            }
        )
    report = backend.preflight(fresh=True)
    server = {
        "address": backend.server_address,
        "summary": report.summary(),
        "warnings": list(report.warnings),
        "full": report.full,
        "used_memory": report.used_memory,
        "maxmemory": report.maxmemory,
    }
    return {"backend": backend.alias, "server": server, "queues": queues, "workers": [_worker(w) for w in workers]}


def _throttle(state: LimitState, holding: Sequence[TaskLimitState]) -> str | None:
    """Return what holds a throttled queue back, in words (its limits, else per-task ones); None when nothing does."""
    if not state.throttled:
        if holding:
            return "held by per-task limits: " + ", ".join(s.holding_text() for s in holding)
        return None
    if state.at_concurrency:
        return f"throttled: {state.running}/{state.limit.concurrency} running"
    return f"rate limited, next in {state.next_token_s:.1f} s"


def _worker(document: dict[str, Any]) -> dict[str, Any]:
    fields = ("worker", "state", "queues", "threads", "busy_threads", "tasks_done", "heartbeat_age_s")
    parsed = WorkerName.parse(str(document.get("worker", "")))
    where = {"host": parsed.host, "pid": parsed.pid} if parsed else {"host": None, "pid": None}
    return {name: document.get(name) for name in fields} | where


def known_workers(now: float) -> list[WorkerSnapshot]:
    """Return the workers the telemetry hub heard; until it listened long enough, the heartbeats stored in Redis.

    The heartbeats make the first render after the site starts right at once, instead of
    "waiting for telemetry" until the first snapshot arrives on the channel.
    """
    from . import controls
    from .queues import backend_aliases
    from .workers import hub

    if hub().warmed_up(now):
        return hub().workers(now)
    return [
        snapshot_of_heartbeat(alias, document, now)
        for alias in backend_aliases()
        for document in controls.live_worker_documents(alias)
    ]


def snapshot_of_heartbeat(alias: str, document: dict, now: float) -> WorkerSnapshot:
    """Return a live worker's stored heartbeat document as the snapshot the telemetry would carry."""
    from .workers import WorkerSnapshot, parse_worker_event

    snapshot = parse_worker_event(alias, {**document, "type": "worker"}, now)
    if snapshot is None:  # a document without a pid: name it by its worker id
        name = str(document.get("worker", ""))
        parsed = WorkerName.parse(name) or WorkerName(name or "?", 0)
        snapshot = WorkerSnapshot(alias, parsed.host, parsed.pid, last_seen=now, name=name)
    return snapshot


def queue_status(
    alias: str,
    queue_name: str,
    counts: dict[Segment, int],
    workers: list[WorkerSnapshot],
    now: float,
    overdue: bool = False,
    paused: PausedQueue | None = None,
    limit: LimitState | None = None,
    holding: Sequence[TaskLimitState] = (),
) -> tuple[str, str]:
    """Answer "why is nothing running?" for one queue: a sentence and a level (ok, warn, bad).

    A queue its limits hold back is not stuck: it says so, at the ok level. So does one with
    ready tasks and idle threads while per-task limits it has carried (`holding`) are reached.
    """
    if paused is not None:
        since = paused.since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        by = paused.by or "someone"
        return f"Paused by {by} since {since}: workers take none of its tasks until it is resumed.", "warn"
    if overdue:
        return "Leases overdue: a worker died holding tasks and no reaper has taken them back yet.", "bad"
    serving = [w for w in workers if w.state == "live" and w.serves(alias, queue_name)]
    ready = counts[Segment.READY]
    if not serving:
        return ("No live workers for this queue.", "bad") if ready else ("No live workers for this queue.", "warn")
    if limit is not None and limit.throttled:
        if limit.at_concurrency:
            return f"Throttled: {limit.running}/{limit.limit.concurrency} running (its concurrency limit).", "ok"
        return f"Rate limited ({limit.limit.rate}): the next start in {limit.next_token_s:.1f} s.", "ok"
    if ready and all(w.threads and w.busy >= w.threads for w in serving):
        return f"All {sum(w.threads for w in serving)} threads are busy.", "warn"
    if ready and holding:
        return f"Held by per-task limits: {', '.join(s.holding_text() for s in holding)}.", "ok"
    return f"{len(serving)} live worker{'s' if len(serving) != 1 else ''}.", "ok"


def limits_text(limit: LimitState | QueueLimit | None) -> str:
    """The limits in force of a queue (or these limits) in words ("3 at once, 100/m"), "" when it has none."""
    from ..backends.tooling.controls import LimitState

    if limit is None:
        return ""
    if isinstance(limit, LimitState):
        limit = limit.limit
    parts = []
    if limit.concurrency is not None:
        parts.append(f"{limit.concurrency} at once")
    if limit.rate is not None:
        parts.append(str(limit.rate))
    return ", ".join(parts)


def lease_overdue(alias: str, queue_name: str, now: float | None = None) -> bool:
    """Return whether the running task with the earliest lease deadline is past it."""
    from .queues import get_backend

    running = get_backend(alias).peek(queue_name, segment=Segment.RUNNING, count=1)
    deadline = getattr(running.items[0], "lease_deadline", None) if running.items else None
    return deadline is not None and deadline.timestamp() < (time.time() if now is None else now)
