"""Worker telemetry as the console sees it: one subscription per process, the last snapshot of each worker.

Each worker process publishes a snapshot every `SNAPSHOT_INTERVAL_S` on its backend's
telemetry channel (`threadmill.telemetry`). `TelemetryHub` holds this process's only
subscription to those channels, keeps the last snapshot of every worker, decides whether
it is live, lost (silent for three intervals) or stopped, and tells listeners what changed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends.keys import KeySchema
from ..identity import WorkerName
from ..redaction import redact_text
from ..worker.telemetry import SNAPSHOT_INTERVAL_S
from .queues import backend_aliases, get_backend

logger = logging.getLogger("threadmill.api")

#: Seconds between two worker snapshots when a snapshot does not say.
DEFAULT_TELEMETRY_INTERVAL_S = SNAPSHOT_INTERVAL_S
#: Snapshot intervals a worker may stay silent before it is shown as lost.
LOST_AFTER_INTERVALS = 3
#: Seconds a stopped or lost worker stays listed after it was last heard from.
FORGET_WORKER_AFTER_S = 3600.0
#: Most task ids one progress message is read for (a report call's tasks; a longer list is cut).
PROGRESS_IDS_PER_MESSAGE = 500


@dataclass(slots=True)
class WorkerSnapshot:
    """The last thing one worker process said about itself on the telemetry channel."""

    alias: str
    host: str
    pid: int
    queues: list[str] = field(default_factory=list)
    threads: int = 0
    busy: int = 0
    buffer: int = 0
    buffer_size: int = 0
    tasks_done: int = 0
    tasks_per_minute: float = 0.0
    cpu_percent: float = 0.0
    rss: int = 0
    started_at: float | None = None
    interval: float = DEFAULT_TELEMETRY_INTERVAL_S
    last_seen: float = 0.0
    stopped: bool = False
    state: str = "live"
    #: The worker's id ("host:pid:incarnation", or an older release's "host:pid"), which worker commands name.
    name: str = ""
    #: What the worker said it is doing: "running", "quiet" or "stopping".
    reported: str = "running"

    @property
    def key(self) -> tuple[str, str]:
        # By name, not (host, pid): a restarted container's new process has the old one's pid.
        return (self.alias, self.name or f"{self.host}:{self.pid}")

    @property
    def incarnation(self) -> str:
        """Return what tells this process apart from an earlier one with the same host and pid ("" if unknown)."""
        parsed = WorkerName.parse(self.name)
        return parsed.incarnation if parsed else ""

    def serves(self, alias: str, queue_name: str) -> bool:
        return self.alias == alias and (not self.queues or queue_name in self.queues)

    def uptime_s(self, now: float) -> float | None:
        return None if self.started_at is None else max(0.0, now - self.started_at)


#: First and longest pause before the hub subscribes again after losing its subscription, seconds.
RETRY_FIRST_PAUSE_S = 1.0
RETRY_MAX_PAUSE_S = 5.0
#: Largest magnitude a snapshot's number may have; anything past it is read as missing.
MAX_TELEMETRY_NUMBER = 2**63


def _number(event: dict, *names: str, default: float = 0) -> float:
    for name in names:
        value = event.get(name)
        # JSON allows Infinity, NaN and 400-digit numbers, which int() or a template cannot take.
        if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < MAX_TELEMETRY_NUMBER:
            return value
    return default


def parse_worker_event(alias: str, event: dict, now: float) -> WorkerSnapshot | None:
    """Return the worker snapshot an event carries, or None when it is not about a worker."""
    if event.get("type") not in ("worker", "snapshot", "stopped") or "pid" not in event:
        return None
    queues = event.get("queues")
    host, pid = str(event.get("host", "?")), int(_number(event, "pid"))
    return WorkerSnapshot(
        alias=alias,
        host=host,
        pid=pid,
        queues=[str(q) for q in queues] if isinstance(queues, list) else [],
        threads=int(_number(event, "threads")),
        busy=int(_number(event, "busy", "busy_threads")),
        buffer=int(_number(event, "buffer", "buffer_fill", "buffered")),
        buffer_size=int(_number(event, "buffer_size", "prefetch_count", "prefetch")),
        tasks_done=int(_number(event, "tasks_done", "done")),
        tasks_per_minute=float(_number(event, "tasks_per_minute")),
        cpu_percent=float(_number(event, "cpu_percent", "cpu")),
        rss=int(_number(event, "rss", "rss_bytes")),
        started_at=_number(event, "started_at", default=0) or None,
        interval=float(_number(event, "interval", "interval_s", default=DEFAULT_TELEMETRY_INTERVAL_S)),
        last_seen=now,
        stopped=event.get("type") == "stopped" or event.get("state") == "stopped" or event.get("stopped") is True,
        name=str(event.get("worker") or f"{host}:{pid}"),
        reported=str(event.get("state") or "running"),
    )


Listener = Callable[[str], None]


class TelemetryHub:
    """One telemetry subscription per process: keeps the last snapshot of every worker and tells listeners.

    Listeners are called from the hub's thread with the kind of change ("queues" for
    ingress/egress, "workers" for a snapshot, "tick" every interval); they must only hand
    the news to their own thread or event loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: dict[tuple[str, str], WorkerSnapshot] = {}
        self._listeners: set[Listener] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.started_at = 0.0
        #: Counts the changes heard so far; a render made at one generation is current until the next.
        self.generation = 0
        #: Counts the times the subscription was lost (or could not be made) and retried.
        self.losses = 0

    def start(self) -> TelemetryHub:
        """Start the subscribing thread once; later calls do nothing."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self.started_at = time.time()
                self._thread = threading.Thread(target=self._run, name="threadmill-telemetry", daemon=True)
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def subscribe(self, listener: Listener) -> None:
        self.start()
        with self._lock:
            self._listeners.add(listener)

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def warmed_up(self, now: float) -> bool:
        """Return whether the hub listened long enough to have heard every live worker."""
        return bool(self.started_at) and now - self.started_at >= LOST_AFTER_INTERVALS * DEFAULT_TELEMETRY_INTERVAL_S

    def workers(self, now: float | None = None) -> list[WorkerSnapshot]:
        """Return every worker heard from, its state (live, lost, stopped) as of `now`, by host then pid."""
        self.start()
        now = time.time() if now is None else now
        with self._lock:
            for key in [k for k, w in self._workers.items() if now - w.last_seen > FORGET_WORKER_AFTER_S]:
                del self._workers[key]
            snapshots = list(self._workers.values())
        for snapshot in snapshots:
            if snapshot.stopped:
                snapshot.state = "stopped"
            elif now - snapshot.last_seen > LOST_AFTER_INTERVALS * snapshot.interval:
                snapshot.state = "lost"
            else:
                snapshot.state = "live"
        return sorted(snapshots, key=lambda s: (s.host, s.pid))

    def record(self, alias: str, payload: bytes | str, now: float | None = None) -> str | None:
        """Apply one telemetry message; return the kind of change, None for a message it cannot read."""
        kinds = self.changes(alias, payload, now)
        return kinds[0] if kinds else None

    def changes(self, alias: str, payload: bytes | str, now: float | None = None) -> list[str]:
        """Apply one telemetry message; return the kinds of change it makes, none for one it cannot read.

        A progress message (report.lua's) makes "progress:<task id>" for each task it names, at
        most `PROGRESS_IDS_PER_MESSAGE`, then "progress".
        """
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):  # deep nesting exhausts the parser's recursion limit
            logger.warning("Ignoring a telemetry message that is not JSON: %r", payload[:200])
            return []
        if not isinstance(event, dict):
            return []
        if event.get("type") == "progress":
            keys = event.get("keys")
            keys = keys[:PROGRESS_IDS_PER_MESSAGE] if isinstance(keys, list) else []
            ids = [task_id for key in keys if isinstance(key, str) and (task_id := KeySchema.task_id_of(key))]
            return [*(f"progress:{task_id}" for task_id in ids), "progress"]
        kind = self._apply(alias, event, now)
        return [kind] if kind else []

    def _apply(self, alias: str, event: dict, now: float | None) -> str | None:
        if event.get("type") in ("ingress", "egress"):
            return "queues"
        snapshot = parse_worker_event(alias, event, time.time() if now is None else now)
        if snapshot is None:
            return None
        with self._lock:
            self._workers[snapshot.key] = snapshot
        return "workers"

    def _notify(self, kind: str) -> None:
        with self._lock:
            self.generation += 1
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(kind)
            except Exception:
                logger.exception("A telemetry listener failed.")

    def _run(self) -> None:
        # The retry pause doubles up to RETRY_MAX_PAUSE_S and one cause is logged once as a
        # warning, not every second for as long as a server is down or refused.
        pause, last_problem = RETRY_FIRST_PAUSE_S, None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._listen()
            except Exception as e:  # noqa: BLE001 - a lost server must not end the hub; it retries
                self.losses += 1
                problem = f"{type(e).__name__}: {redact_text(str(e))}"
                log = logger.debug if problem == last_problem else logger.warning
                log("Telemetry subscription lost (%s); retrying in %g s.", problem, pause)
                last_problem = problem
            if time.monotonic() - started > RETRY_MAX_PAUSE_S:
                # It listened a while: the next loss starts short again and is worth a warning.
                pause, last_problem = RETRY_FIRST_PAUSE_S, None
            self._stop.wait(pause)
            pause = min(pause * 2, RETRY_MAX_PAUSE_S)

    def _listen(self) -> None:
        # One subscription per distinct server or cluster, whatever the number of browser tabs
        # (on a cluster, sharded: one connection per node owning a channel's slot).
        channels: dict[tuple[str, bool, str, str], dict[str, str]] = {}
        for alias in backend_aliases():
            backend = get_backend(alias)
            names = channels.setdefault(_connection_of(backend), {})
            # Task scripts publish on their partition's channel, heartbeats on partition 0's.
            for partition in backend.covered_partitions():
                names[backend.keys_for(partition).telemetry()] = alias
        subscriptions = []
        for names in channels.values():
            subscription = get_backend(next(iter(names.values()))).subscribe_telemetry(list(names))
            subscriptions.append((subscription, names))
        last_tick = time.monotonic()
        try:
            while not self._stop.is_set():
                for subscription, names in subscriptions:
                    message = subscription.next_message(timeout=0.2 / len(subscriptions))
                    if message:
                        channel, payload = message
                        for kind in self.changes(names[channel], payload):
                            self._notify(kind)
                if time.monotonic() - last_tick >= DEFAULT_TELEMETRY_INTERVAL_S:
                    last_tick = time.monotonic()
                    self._notify("tick")
        finally:
            for subscription, _ in subscriptions:
                subscription.close()


def _connection_of(backend) -> tuple[str, bool, str, str]:
    """What decides the connection a backend subscribes on: its URL, whether a cluster, and its client options.

    Two aliases of one URL whose `OPTIONS["connection"]` differ (another ACL user, another TLS
    certificate) must not share one alias's connection.
    """
    config = backend.config
    return (
        backend.redis_url,
        backend.cluster,
        repr(sorted(config.connection.items())),
        repr(sorted(config.sentinel.items())),
    )


_hub = TelemetryHub()


def hub() -> TelemetryHub:
    """Return this process's telemetry hub."""
    return _hub
