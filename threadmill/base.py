"""Backend-neutral types of Threadmill's tooling API: segments, pages and the task class.

A queue's tasks live in exactly one *segment* at a time. The console and the worker
read them through these types only, so they never depend on how a backend stores them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import partial
from typing import Any, cast

from django.tasks import Task, TaskResult

from .limits import LimitError, parse_concurrency, parse_rate
from .progress import TaskProgress


class Segment(StrEnum):
    """One of a queue's sets; a task is in exactly one of them."""

    READY = "ready"
    DEFERRED = "deferred"
    RUNNING = "running"
    SUCCESSFUL = "successful"
    FAILED = "failed"
    UNREADABLE = "unreadable"
    #: A workflow task some of whose parents are not final yet (`threadmill.workflows`); READY to Django.
    WAITING = "waiting"

    @classmethod
    def parse(cls, value: Segment | str) -> Segment:
        """Return the member for `value`, raising ValueError naming an unknown segment."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(member.value for member in cls)
            raise ValueError(f"Unknown segment {value!r}; expected one of {names}.") from None


#: Segments a unique task's holder counts in unless the task says otherwise.
DEFAULT_UNIQUE_SEGMENTS = (Segment.READY, Segment.DEFERRED, Segment.RUNNING)
#: Segments a task can be counted in (an unreadable payload is nobody's holder).
COUNTABLE_SEGMENTS = frozenset(Segment) - {Segment.UNREADABLE, Segment.WAITING}

#: Segments a task can be requeued from (a waiting task leaves only when its parents release it).
REQUEUEABLE_SEGMENTS = frozenset(Segment) - {Segment.READY, Segment.WAITING}
#: Segments whose tasks a delete or a purge removes: a waiting workflow task's record would go on counting
#: it (never finishing), so it is cancelled instead, which counts it and settles its children.
DELETABLE_SEGMENTS = frozenset(Segment) - {Segment.WAITING}
#: Why a waiting task is not deleted or purged, as the console and `RedisTaskBackend` say it.
WAITING_NOT_DELETABLE = (
    "Waiting workflow tasks cannot be deleted or purged: their workflow's record would go on counting them "
    "and never finish. Cancel them instead: each is recorded FAILED and settles its children by their policy."
)

#: The failures a stored payload raises when this code cannot read it as a task.
#: UnicodeDecodeError: bytes that are not UTF-8. ValueError: not JSON, an unknown
#: status, a bad timestamp. TypeError: JSON of the wrong shape (a list, a string).
#: KeyError: a required field missing, a malformed error entry. ImportError: the task
#: module, the task function or the retry callback is gone from the code base.
UNREADABLE_PAYLOAD_ERRORS: tuple[type[Exception], ...] = (
    UnicodeDecodeError,
    ValueError,
    TypeError,
    KeyError,
    ImportError,
)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt of a task: its worker, lease, run and outcome ("running" for the attempt going on)."""

    worker: str
    leased_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str
    error: str = ""

    @property
    def duration(self) -> timedelta | None:
        """How long the run took, None when its start or end is not known."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


@dataclass(frozen=True, slots=True)
class PausedQueue:
    """Who paused a queue, and since when (the server's clock)."""

    by: str
    since: datetime


@dataclass(frozen=True, slots=True)
class HeartbeatReading:
    """Every worker's last heartbeat, read in one round trip with the clock and uptime of the server holding them."""

    #: The server's clock, epoch seconds.
    now: float
    #: Worker name -> its last heartbeat, server epoch seconds.
    beats: dict[str, float]
    #: Whole seconds the server has been up (INFO's `uptime_in_seconds`).
    uptime_s: float

    def settles_in(self, settle_s: float) -> float:
        """Return the seconds until the server has been up `settle_s`, 0 once it has."""
        return max(0.0, settle_s - self.uptime_s)


@dataclass(frozen=True, slots=True)
class UnreadableTask:
    """A stored task whose payload this code cannot read, kept exactly as stored."""

    id: str
    queue_name: str
    segment: Segment
    raw: bytes
    error: str

    @property
    def preview(self) -> str:
        """Return the raw payload as text, undecodable bytes replaced."""
        return self.raw.decode("utf-8", errors="replace")


class Page(Sequence):
    """One page of a segment: its items in queue order and the segment's `total`."""

    __slots__ = ("items", "total")

    def __init__(self, items: list[ThreadmillTaskResult | UnreadableTask], total: int) -> None:
        self.items = items
        self.total = total

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Page(items={len(self.items)}, total={self.total})"


@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadmillTask(Task):
    """A Django task with optional retry policy (`retry=`), time limit (`timeout=`), uniqueness (`unique=`)
    and limits on its runs across every worker (`concurrency=`, `rate=`)."""

    retry: Any = None
    #: Longest a run may take before TaskTimeout is raised in it; None takes the alias's `task_timeout`.
    timeout: timedelta | None = None
    #: Whether enqueueing a duplicate of a waiting or running call returns that task (`threadmill.unique`).
    unique: bool = False
    #: `(args, kwargs) -> str` naming the work a call does (implies `unique`); None: its arguments.
    unique_key: Any = None
    #: Longest a duplicate is refused after the first enqueue; None: while the first counts.
    unique_for: timedelta | None = None
    #: Segments the first call counts in; by default ready, deferred and running.
    unique_segments: tuple[Segment, ...] = DEFAULT_UNIQUE_SEGMENTS
    #: Most runs of this task leased at once across every worker (`threadmill.limits`); None: no limit.
    concurrency: int | None = None
    #: Most runs of this task started per unit, "N/s", "N/m" or "N/h", across every worker; None: no limit.
    rate: str | None = None

    def __post_init__(self) -> None:
        from django.tasks.exceptions import InvalidTask

        if self.retry is not None and not callable(self.retry):
            raise InvalidTask("retry must be a retry policy or a callable taking a TaskContext.")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _time_limit(self.timeout, InvalidTask))
        self._check_unique(InvalidTask)
        self._check_limits(InvalidTask)
        super(ThreadmillTask, self).__post_init__()

    def _check_limits(self, error: type[Exception]) -> None:
        try:
            if self.concurrency is not None:
                object.__setattr__(self, "concurrency", parse_concurrency(self.concurrency))
            if self.rate is not None:
                object.__setattr__(self, "rate", str(parse_rate(self.rate)))
        except LimitError as e:
            raise error(f"{e}") from None

    def _check_unique(self, error: type[Exception]) -> None:
        if self.unique_key is not None and not callable(self.unique_key):
            raise error("unique_key must be a callable taking (args, kwargs) and returning a str.")
        if not isinstance(self.unique, bool):
            raise error(f"unique must be True or False, not {self.unique!r}.")
        object.__setattr__(self, "unique", self.unique or self.unique_key is not None or self.unique_for is not None)
        if self.unique_for is not None:
            object.__setattr__(self, "unique_for", _time_limit(self.unique_for, error, "unique_for"))
        object.__setattr__(self, "unique_segments", unique_segments(self.unique_segments, error))

    def enqueue_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Enqueue this task with these arguments once the default database's current transaction commits.

        Nothing is enqueued when it rolls back; outside a transaction it enqueues at once. The
        task and its arguments are checked (and the arguments copied) at the call, so bad input
        raises here, not at the commit; an enqueue that fails after the commit raises from it.
        For another database: `transaction.on_commit(partial(task.enqueue, ...), using=alias)`.
        """
        from django.db import transaction
        from django.utils.json import normalize_json

        self.get_backend().validate_task(self)
        # normalize_json returns a value of the shape it was given: a list, a dict.
        call_args = cast("list[Any]", normalize_json(list(args)))
        call_kwargs = cast("dict[str, Any]", normalize_json(kwargs))
        transaction.on_commit(partial(self.enqueue, *call_args, **call_kwargs))

    def enqueue_many(self, calls):
        """Enqueue this task once per (args, kwargs) of `calls` in as few round trips as the backend can."""
        backend = self.get_backend()
        if hasattr(backend, "enqueue_many"):
            return backend.enqueue_many(self, calls)
        return [backend.enqueue(self, args, kwargs) for args, kwargs in calls]


def unique_segments(value: Iterable[Segment | str], error: type[Exception]) -> tuple[Segment, ...]:
    """Return `value` as segments, raising `error` naming an unknown or uncountable one."""
    if isinstance(value, str):
        value = (value,)
    try:
        segments = tuple(dict.fromkeys(Segment.parse(name) for name in value))
    except (TypeError, ValueError) as e:
        raise error(f"unique_segments must name segments of {sorted(COUNTABLE_SEGMENTS)}: {e}") from None
    if not segments or not set(segments) <= COUNTABLE_SEGMENTS:
        raise error(f"unique_segments must name one or more of {sorted(COUNTABLE_SEGMENTS)}, not {value!r}.")
    return segments


def _time_limit(value: Any, error: type[Exception], name: str = "timeout") -> timedelta:
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < float("inf"):
        raise error(f"{name} must be a positive number of seconds or a timedelta, not {value!r}.")
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


def time_limit_s(task: Task, default_s: float | None) -> float | None:
    """Return the time limit a run of `task` gets in seconds: its own, else `default_s` (None: no limit)."""
    limit = getattr(task, "timeout", None)
    return default_s if limit is None else limit.total_seconds()


# django-stubs declares TaskResult as a plain dataclass; Django's own is frozen, like this one.
@dataclass(frozen=True, slots=True, kw_only=True)
class ThreadmillTaskResult(TaskResult):  # type: ignore[misc]
    """A task result that also carries the lease it was acquired under."""

    lease_worker: str = ""
    lease_token: str = ""
    lease_started_at: datetime | None = None
    lease_deadline: datetime | None = None
    segment: Segment | None = field(default=None)
    #: Set by acquire for a suspect (a task that was in a lost worker's lease): the lost workers in a
    #: row it may have caused. Its worker records the run's start and finish. None for any other task.
    worker_losses: int | None = None
    #: What the task last reported with `threadmill.set_progress`, or None.
    progress: TaskProgress | None = None
    #: What the task stored with `threadmill.set_metadata`; empty when it stored none.
    metadata: dict[str, Any] = field(default_factory=dict)
    #: The uniqueness key (its Redis key name) a unique task holds; "" for any other task.
    unique_key: str = ""
    #: True when enqueue found this task waiting or running and returned it instead of storing a duplicate.
    duplicate: bool = False
    #: The W3C trace context (`traceparent`, `tracestate`) recorded at enqueue, or None.
    trace_context: dict[str, str] | None = None
    #: The attempts recorded for this task, oldest first (`threadmill.attempts`); empty for one run by an older release.
    attempt_records: tuple[Attempt, ...] = ()
    #: Set by the worker that ran this attempt: (start, end) of the run, server-clock epoch seconds.
    ran: tuple[float, float] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Arguments read back from a stored document are JSON already; normalising them
        # again cost about a third of decoding. enqueue() normalises what callers pass.
        pass


def return_value_of(result: TaskResult) -> Any:
    """Return the stored return value without the status check `return_value` applies."""
    return result._return_value  # type: ignore[attr-defined]  # a private field django-stubs leaves out


def json_preview(value: Any, limit: int = 200) -> str:
    """Return `value` as compact JSON, cut to `limit` characters with an ellipsis."""
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
