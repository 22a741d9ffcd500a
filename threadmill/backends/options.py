"""The backend's `OPTIONS`, parsed once into a frozen dataclass."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..limits import LimitError, QueueLimit, check_partitions, parse_limit

#: Default time a worker may hold a task before the reaper takes it back, seconds.
DEFAULT_LEASE_TTL_S = 3600.0
#: Default time a finished task's result is kept, seconds.
DEFAULT_RESULT_TTL_S = 86400.0
#: Default pause between two broker (mover and reaper) passes, seconds.
DEFAULT_BROKER_INTERVAL_S = 1.0
#: Default least time between two sweeps of the waiting workflow tasks, seconds ("within seconds", issue 32;
#: each costs an idle queue a script call).
DEFAULT_SWEEP_INTERVAL_S = 5.0
#: Default most tasks the mover, reaper or purge handles in one script call.
DEFAULT_BATCH_SIZE = 100
#: Default first pause of a polling acquire, seconds.
DEFAULT_POLL_INTERVAL_S = 0.01
#: Default longest pause of a polling acquire, seconds.
DEFAULT_POLL_MAX_INTERVAL_S = 1.0
#: Default age of a worker's last heartbeat after which the broker recovers its leases, seconds.
DEFAULT_WORKER_TIMEOUT_S = 15.0
#: Default time a command may wait for the server's reply before the connection counts as lost, seconds.
DEFAULT_SOCKET_TIMEOUT_S = 5.0
#: Default time a task past its limit has to end before its worker process is replaced, seconds.
DEFAULT_TIMEOUT_GRACE_S = 10.0
#: Default time an aborted task has to end by itself before TaskCancelled is raised in it, seconds.
DEFAULT_ABORT_GRACE_S = 10.0
#: Default longest an enqueue call keeps trying through transient errors, seconds (see `enqueue_retry`).
DEFAULT_ENQUEUE_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Durations in seconds; each accepts a timedelta or a number in `OPTIONS`."""

    #: Longest a worker may hold a task (prefetch buffer included) before the reaper takes it back, seconds.
    lease_ttl: float = DEFAULT_LEASE_TTL_S
    #: How long a finished task and its result are kept, seconds.
    result_ttl: float = DEFAULT_RESULT_TTL_S
    #: Pause between two broker passes (reaper, recovery, trimming), seconds; the mover also runs when a task falls due.
    broker_interval: float = DEFAULT_BROKER_INTERVAL_S
    #: Least time between two sweeps releasing workflow tasks no acknowledgement released, seconds.
    sweep_interval: float = DEFAULT_SWEEP_INTERVAL_S
    #: Most tasks the mover, the reaper or a purge handles in one script call.
    batch_size: int = DEFAULT_BATCH_SIZE
    #: First pause of a busy worker (or `acquire(timeout=...)`) that found nothing ready, seconds.
    poll_interval: float = DEFAULT_POLL_INTERVAL_S
    #: Longest such pause (it doubles each time), seconds.
    poll_max_interval: float = DEFAULT_POLL_MAX_INTERVAL_S
    #: Age of a worker process's last heartbeat past which the broker gives its leases back, seconds.
    worker_timeout: float = DEFAULT_WORKER_TIMEOUT_S
    #: Longest any call waits for the server's reply (and to connect) before the connection counts as lost, seconds.
    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT_S
    #: Whether `enqueue` returns only once the task is in the server's append-only file (WAITAOF).
    fsync_enqueue: bool = False
    #: Replicas that must confirm a task (WAIT) before `enqueue` returns; 0 waits for none.
    wait_replicas: int = 0
    #: Partitions each queue is split into (1 to 256), each under its own hash tag, to spread over a cluster.
    partitions: int = 1
    #: Time limit of a task with none of its own, seconds; None runs it for as long as it takes.
    task_timeout: float | None = None
    #: How long a task past its time limit has to end before its worker process is replaced, seconds.
    timeout_grace: float = DEFAULT_TIMEOUT_GRACE_S
    #: How long a task an abort request reached has to end before TaskCancelled is raised in it, seconds.
    abort_grace: float = DEFAULT_ABORT_GRACE_S
    #: Queue name -> its concurrency and rate limits (`threadmill.limits`); runtime values win.
    limits: Mapping[str, QueueLimit] = field(default_factory=dict)
    #: Longest an enqueue keeps trying through a restart or failover, seconds; 0 tries once.
    enqueue_retry: float = DEFAULT_ENQUEUE_RETRY_S
    #: redis-py keyword arguments of every client and connection (`backends.clients`); checked by `check`.
    connection: Mapping[str, Any] = field(default_factory=dict)
    #: redis-py keyword arguments of the clients of the sentinels of a `redis+sentinel://` REDIS_URL.
    sentinel: Mapping[str, Any] = field(default_factory=dict)

    @property
    def heartbeat_settle(self) -> float:
        """Seconds a server must be up before an old heartbeat means a gone worker: `worker_timeout` + `socket_timeout`.

        A server that restarted restores every heartbeat as it was before the outage; a live
        worker stores its next one within that long (a beat may wait `socket_timeout` on a
        dead connection before it reconnects).
        """
        return self.worker_timeout + self.socket_timeout


_FLAGS = {"fsync_enqueue"}
#: Options that are a count, zero allowed.
_COUNTS = {"wait_replicas"}
#: Options that are redis-py keyword arguments, by name (checked against redis-py by `checks`).
_KEYWORDS = {"connection", "sentinel"}
#: Durations where zero is allowed (it turns the behaviour off).
_ZERO_ALLOWED = {"enqueue_retry"}
#: Most partitions an alias can have: a task id carries its partition in one byte.
MAX_PARTITIONS = 256


def _positive_number(alias: str, name: str, value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be a positive number of seconds or a timedelta, not {value!r}."
        )
    return float(value)


def _seconds_or_zero(alias: str, name: str, value: Any) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be 0 or a positive number of seconds or a timedelta, "
            f"not {value!r}."
        )
    return float(value)


def _count(alias: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be a whole number, 0 or more, not {value!r}."
        )
    return value


def parse_options(alias: str, raw: dict[str, Any]) -> BackendOptions:
    """Return `raw` as BackendOptions; ImproperlyConfigured names any unknown or bad option."""
    known = {f.name for f in fields(BackendOptions)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'] has unknown option(s) {', '.join(unknown)}; "
            f"known options are {', '.join(sorted(known))}."
        )
    parsed: dict[str, Any] = {}
    for name, value in raw.items():
        if name in _FLAGS:
            if not isinstance(value, bool):
                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be True or False, not {value!r}."
                )
            parsed[name] = value
            continue
        if name == "partitions":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['OPTIONS']['partitions'] must be a whole number from 1 to {MAX_PARTITIONS}, "
                    f"not {value!r}."
                )
            parsed[name] = value
            continue
        if name == "limits":
            continue
        if name in _KEYWORDS:
            parsed[name] = _keywords(alias, name, value)
            continue
        if name == "task_timeout" and value is None:
            parsed[name] = None
            continue
        if name in _COUNTS:
            parsed[name] = _count(alias, name, value)
            continue
        if name in _ZERO_ALLOWED:
            parsed[name] = _seconds_or_zero(alias, name, value)
            continue
        number = _positive_number(alias, name, value)
        if name == "batch_size":
            if number != int(number):
                raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['batch_size'] must be a whole number.")
            number = int(number)
        parsed[name] = number
    parsed["limits"] = _limits(alias, raw.get("limits", {}), parsed.get("partitions", 1))
    return BackendOptions(**parsed)


def _keywords(alias: str, name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'][{name!r}] must be a dict of redis-py keyword arguments, "
            f"not a {type(value).__name__}."
        )
    return dict(value)


def _limits(alias: str, raw: Any, partitions: int) -> dict[str, QueueLimit]:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['limits'] must map queue names to their limits, not {raw!r}."
        )
    limits = {}
    for queue_name, limit in raw.items():
        try:
            limits[queue_name] = parse_limit(limit)
            check_partitions(limits[queue_name], partitions)
        except LimitError as e:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']['limits'][{queue_name!r}]: {e}") from None
    return limits
