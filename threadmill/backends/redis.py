"""`RedisTaskBackend`: a thin mapper between Django's TaskResult and the stored task.

Invariants: a task is in exactly one segment of its queue; its `data` is stored exactly
as enqueued and never rewritten by acquire (the lease lives in fields beside it); every
state change is one Lua script; a payload this code cannot read is quarantined in the
`unreadable` segment, never deleted.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json

from ..exceptions import BackendConnectionError, UnreadableTaskError
from . import codec
from .base import (
    UNREADABLE_PAYLOAD_ERRORS,
    Page,
    Segment,
    ThreadmillTask,
    ThreadmillTaskResult,
    UnreadableTask,
)
from .keys import KeySchema
from .options import parse_options
from .scripts import RedisScripts, translate_errors

logger = logging.getLogger("threadmill.backend")

#: Ready score band width: score = (100 - priority) * band + enqueue milliseconds.
PRIORITY_BAND = 10**13
_NEWEST_FIRST = {Segment.SUCCESSFUL, Segment.FAILED, Segment.UNREADABLE}
_FINISHED = {Segment.SUCCESSFUL: TaskResultStatus.SUCCESSFUL, Segment.FAILED: TaskResultStatus.FAILED}
_HASH_FIELDS = ("data", "queue", "segment", "started_at", "lease_worker", "lease_started_at", "lease_token", "read_error")


def default_worker_name() -> str:
    """Return this process's lease holder name, `host:pid`."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode()


def _seconds(value: timedelta | float | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


class RedisTaskBackend(BaseTaskBackend):
    """Durable task backend on Redis or Valkey; see the README for the data model."""

    task_class = ThreadmillTask
    supports_defer = True
    supports_priority = True
    supports_async_task = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.redis_url = params.get("REDIS_URL")
        if not self.redis_url:
            raise ImproperlyConfigured(f"TASKS[{alias!r}] needs a REDIS_URL, such as 'redis://127.0.0.1:6379/0'.")
        self.options = parse_options(alias, params.get("OPTIONS", {}))
        self.keys = KeySchema(alias)
        self._client: redis.Redis | None = None
        self._scripts: RedisScripts | None = None
        self._rotation = 0

    # -- connection -------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        """The redis-py client, created on first use (replies are bytes)."""
        if self._client is None:
            self._client = redis.Redis.from_url(self.redis_url, decode_responses=False)
        return self._client

    @property
    def scripts(self) -> RedisScripts:
        if self._scripts is None:
            self._scripts = RedisScripts(self.client, self.keys)
        return self._scripts

    # -- enqueue and results ----------------------------------------------------------

    def enqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        self.validate_task(task)
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        task_id = codec.new_task_id()
        now = time.time()
        payload = codec.encode_new(task, task_id, args, kwargs, now)
        ready_score = f"{(100 - task.priority) * PRIORITY_BAND + int(now * 1000)}"
        if task.run_after is not None:
            segment, score = Segment.DEFERRED, repr(task.run_after.timestamp())
        else:
            segment, score = Segment.READY, ready_score
        self.scripts.enqueue(task_id, payload, task.queue_name, segment, ready_score, score, int(now // 60))
        result = ThreadmillTaskResult(
            task=task,
            id=task_id,
            status=TaskResultStatus.READY,
            enqueued_at=datetime.fromtimestamp(now, UTC),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
            segment=segment,
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    @translate_errors
    def get_result(self, result_id: str) -> ThreadmillTaskResult:
        """Return the task's current state whatever its segment, or raise TaskResultDoesNotExist."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.task(result_id), _HASH_FIELDS)
        pipe.get(self.keys.result(result_id))
        fields, stored_result = pipe.execute()
        data, queue, segment, started_at, worker, lease_started, token, read_error = fields
        if data is None:
            raise TaskResultDoesNotExist(f"No task with id {result_id!r} is stored.")
        segment = Segment(segment.decode())
        if segment is Segment.UNREADABLE:
            raise UnreadableTaskError(f"Task {result_id} is unreadable: {_text(read_error)}")
        lease_start = codec.moment(lease_started)
        try:
            return codec.decode(
                stored_result or data,
                segment,
                started_at=started_at,
                lease_worker=_text(worker),
                lease_started_at=lease_start,
                lease_token=_text(token),
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            raise UnreadableTaskError(f"Task {result_id} cannot be read: {e!r}") from e

    # -- the worker's verbs -----------------------------------------------------------

    def acquire(
        self, *queue_names: str, count: int = 1, worker: str = "", timeout: timedelta | None = None
    ) -> list[ThreadmillTaskResult]:
        """Lease up to `count` ready tasks round-robin across `queue_names` in one atomic call.

        With `timeout` None this tries once; with a timedelta it polls with exponential
        backoff until a task arrives or the time is up. An empty list means none arrived.
        Payloads this code cannot read are quarantined and not returned.
        """
        queues = list(queue_names) or sorted(self.queues)
        worker = worker or default_worker_name()
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        pause = self.options.poll_interval
        while True:
            results = self._acquire_once(queues, count, worker)
            if results or deadline is None:
                return results
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return results
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, self.options.poll_max_interval)

    def _acquire_once(self, queues: list[str], count: int, worker: str) -> list[ThreadmillTaskResult]:
        shift = self._rotation % len(queues)
        self._rotation += 1
        rotated = queues[shift:] + queues[:shift]
        reply = self.scripts.acquire(rotated, count, worker, self.options.lease_ttl, os.urandom(6).hex())
        now = int(reply[0]) + int(reply[1]) / 1e6
        lease_start = datetime.fromtimestamp(now, UTC)
        deadline = datetime.fromtimestamp(now + self.options.lease_ttl, UTC)
        results = []
        for i in range(2, len(reply), 5):
            task_id, data, started_at, token = reply[i].decode(), reply[i + 1], reply[i + 2], reply[i + 3].decode()
            try:
                results.append(
                    codec.decode(
                        data,
                        Segment.RUNNING,
                        started_at=started_at,
                        lease_worker=worker,
                        lease_started_at=lease_start,
                        lease_token=token,
                        lease_deadline=deadline,
                    )
                )
            except UNREADABLE_PAYLOAD_ERRORS as e:
                self._quarantine(task_id, rotated[int(reply[i + 4]) - 1], Segment.RUNNING, e, token, "acquire")
        return results

    def _quarantine(self, task_id: str, queue_name: str, segment: Segment, error: Exception, token: str, path: str) -> None:
        text = f"{type(error).__name__}: {error}"
        logger.error("Task %s on queue %s is unreadable (%s path) and was quarantined: %s", task_id, queue_name, path, text)
        self.scripts.quarantine(task_id, queue_name, segment, text, token)

    def acknowledge(self, result: TaskResult, return_value: Any = None) -> bool:
        """Store a finished result and release its lease; False when the fence refused it."""
        return self.acknowledge_many([(result, return_value)])[0]

    def acknowledge_many(self, outcomes: Sequence[tuple[TaskResult, Any]]) -> list[bool]:
        """Acknowledge several finished results in one script call, each fenced by its lease token."""
        entries = []
        for result, return_value in outcomes:
            segment = Segment.SUCCESSFUL if result.status == TaskResultStatus.SUCCESSFUL else Segment.FAILED
            document = codec.encode_result(result, return_value)
            entries.append((result.id, result.task.queue_name, result.lease_token, document, segment))
        accepted = self.scripts.acknowledge(entries, self.options.result_ttl, int(time.time() // 60))
        for (result, _), ok in zip(outcomes, accepted, strict=True):
            if not ok:
                logger.warning(
                    "Acknowledgement of task %s refused: its lease (token %s) expired and the task was leased again.",
                    result.id,
                    result.lease_token,
                )
        return [bool(ok) for ok in accepted]

    def requeue(self, task: str | TaskResult, *, run_after: datetime | timedelta | None = None) -> bool:
        """Move a task back to ready (or to deferred with `run_after`), keeping its id.

        Given an id, the stored payload is kept as it is (it may be unreadable). Given a
        TaskResult, its errors and worker ids are stored with it and the call is fenced by
        its lease token. Returns False when there is no such task, it is already ready,
        or the fence refused it.
        """
        at = self._run_after_seconds(run_after)
        if isinstance(task, TaskResult):
            reply = self.scripts.requeue(
                task.id,
                task.task.queue_name,
                run_after=at,
                token=getattr(task, "lease_token", ""),
                document=codec.encode_result(task),
            )
        else:
            queue = self.client.hget(self.keys.task(task), "queue")
            if queue is None:
                return False
            reply = self.scripts.requeue(task, queue.decode(), run_after=at)
        if reply == -1:
            logger.warning("Requeue of task %s refused: its lease was taken over.", getattr(task, "id", task))
        return reply == 1

    @staticmethod
    def _run_after_seconds(run_after: datetime | timedelta | None) -> float | None:
        if run_after is None:
            return None
        if isinstance(run_after, timedelta):
            return time.time() + run_after.total_seconds()
        return run_after.timestamp()

    # -- tooling ----------------------------------------------------------------------

    def purge(self, queue_name: str, *, segment: Segment | str) -> int:
        """Delete a segment and the task data it owns, in batches; return how many were removed."""
        segment = Segment.parse(segment)
        removed = 0
        while batch := self.scripts.purge(queue_name, segment, self.options.batch_size):
            removed += batch
        return removed

    def delete(self, task_ids: Iterable[str]) -> int:
        """Remove the given tasks, their data and results; return how many existed."""
        ids = list(task_ids)
        return self.scripts.delete(ids) if ids else 0

    def peek(self, queue_name: str, *, segment: Segment | str, offset: int = 0, count: int = 50) -> Page:
        """Return one page of a segment in queue order, with the segment's total, in one round trip."""
        segment = Segment.parse(segment)
        if offset < 0 or count < 1:
            raise ValueError("peek needs offset >= 0 and count >= 1.")
        reply = self.scripts.peek(queue_name, segment, offset, count, segment in _NEWEST_FIRST)
        items = [self._peeked(queue_name, segment, reply[i : i + 9]) for i in range(2, len(reply), 9)]
        return Page(items, int(reply[0]))

    def _peeked(self, queue_name: str, segment: Segment, row: list) -> TaskResult | UnreadableTask:
        task_id = row[0].decode()
        data, stored_result, started_at, worker, lease_started, token, read_error, score = row[1:]
        raw = stored_result or data or b""
        if segment is Segment.UNREADABLE:
            return UnreadableTask(task_id, queue_name, segment, raw, _text(read_error))
        try:
            return codec.decode(
                raw,
                segment,
                started_at=started_at or None,
                lease_worker=_text(worker),
                lease_started_at=codec.moment(lease_started),
                lease_token=_text(token),
                lease_deadline=codec.moment(score) if segment is Segment.RUNNING else None,
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            if segment not in _FINISHED:
                self._quarantine(task_id, queue_name, segment, e, _text(token), "peek")
            return UnreadableTask(task_id, queue_name, segment, raw, f"{type(e).__name__}: {e}")

    @translate_errors
    def queue_names(self) -> list[str]:
        """Return every configured queue and every queue a task was enqueued on, sorted."""
        stored = {q.decode() for q in self.client.smembers(self.keys.queues())}
        return sorted(stored | set(self.queues))

    @translate_errors
    def queue_stats(self) -> dict[str, dict[Segment, int]]:
        """Return, for every queue, the number of tasks in each segment."""
        names = self.queue_names()
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for segment in Segment:
                pipe.zcard(self.keys.segment(name, segment))
        counts = iter(pipe.execute())
        return {name: {segment: next(counts) for segment in Segment} for name in names}

    @translate_errors
    def oldest_ready_enqueued_at(self, queue_names: Sequence[str]) -> dict[str, datetime | None]:
        """Return when each queue's oldest ready task was enqueued, for its latency.

        Reads the head and tail of the ready set only (two entries, whatever its depth):
        exact when the queue uses one or two priorities, a lower bound on age otherwise.
        """
        pipe = self.client.pipeline(transaction=False)
        for name in queue_names:
            key = self.keys.segment(name, Segment.READY)
            pipe.zrange(key, 0, 0, withscores=True)
            pipe.zrange(key, -1, -1, withscores=True)
        replies = pipe.execute()
        out: dict[str, datetime | None] = {}
        for index, name in enumerate(queue_names):
            rows = replies[2 * index] + replies[2 * index + 1]
            oldest = min((int(score) % PRIORITY_BAND for _, score in rows), default=None)
            out[name] = None if oldest is None else datetime.fromtimestamp(oldest / 1000, UTC)
        return out

    @translate_errors
    def throughput(self, queue_name: str, *, minutes: int = 60, now: float | None = None) -> dict[str, list[int]]:
        """Return tasks in (`ingress`) and out (`egress`) of a queue per minute, oldest first."""
        current = int((time.time() if now is None else now) // 60)
        span = range(current - minutes + 1, current + 1)
        keys = [self.keys.throughput(queue_name, d, m) for d in ("ingress", "egress") for m in span]
        values = [int(v or 0) for v in self.client.mget(keys)]
        return {"ingress": values[:minutes], "egress": values[minutes:]}

    # -- console tooling (see threadmill.api) ------------------------------------------

    def peek_matching(
        self, queue_name: str, *, segment: Segment | str, needles: Sequence[str], offset: int = 0, count: int = 50,
        scan_limit: int = 100_000, newest_first: bool | None = None,
    ) -> tuple[Page, bool]:
        """Return one page of the tasks whose document contains every needle, in one round trip.

        The page's total counts the matches among the first `scan_limit` entries; the
        boolean is False when the segment is longer than that, so the total is a lower bound.
        Without needles it is a plain page at any depth. `newest_first` None keeps the
        segment's natural order (finished segments newest first, others in queue order).
        """
        segment = Segment.parse(segment)
        if offset < 0 or count < 1:
            raise ValueError("peek_matching needs offset >= 0 and count >= 1.")
        reply = self.scripts.peek_matching(
            queue_name, segment, offset, count,
            segment in _NEWEST_FIRST if newest_first is None else newest_first, scan_limit, needles,
        )
        items = [self._peeked(queue_name, segment, reply[i : i + 9]) for i in range(3, len(reply), 9)]
        if segment is Segment.DEFERRED:
            # A deferred task's score is when it runs (a retry's backoff, not the task's own run_after).
            scores = [codec.moment(reply[i + 8]) for i in range(3, len(reply), 9)]
            items = [
                item if isinstance(item, UnreadableTask) else replace(item, task=item.task.using(run_after=at))
                for item, at in zip(items, scores, strict=True)
            ]
        return Page(items, int(reply[0])), bool(int(reply[1]))

    def requeue_many(self, queue_name: str, *, segment: Segment | str, task_ids: Iterable[str]) -> list[str]:
        """Requeue the given tasks of one segment to ready in one script; return the ids that moved."""
        segment = Segment.parse(segment)
        ids = list(task_ids)
        return self.scripts.requeue_many(queue_name, segment, ids) if ids else []

    def requeue_matching(self, queue_name: str, *, segment: Segment | str, needles: Sequence[str] = ()) -> list[str]:
        """Requeue every task of a segment whose document contains every needle, one window per script call.

        Returns the ids that moved. Each task moves atomically; a crash between windows
        leaves the rest where they were.
        """
        segment = Segment.parse(segment)
        moved: list[str] = []
        cursor = 0
        while cursor >= 0:
            ids, cursor = self.scripts.requeue_matching(
                queue_name, segment, cursor, self.options.batch_size, segment in _NEWEST_FIRST, needles
            )
            moved += ids
        return moved

    @translate_errors
    def in_segment(self, queue_name: str, segment: Segment | str, task_ids: Sequence[str]) -> list[str]:
        """Return those of the given task ids that are in one segment of a queue now."""
        if not task_ids:
            return []
        scores = self.client.zmscore(self.keys.segment(queue_name, Segment.parse(segment)), list(task_ids))
        return [task_id for task_id, score in zip(task_ids, scores, strict=True) if score is not None]

    @translate_errors
    def peek_task(self, task_id: str) -> ThreadmillTaskResult | UnreadableTask:
        """Return one task in whatever segment it is, an unreadable one as stored; TaskResultDoesNotExist if none."""
        fields = self.client.hmget(self.keys.task(task_id), ("queue", "segment", "score"))
        if fields[0] is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        queue_name, segment = fields[0].decode(), Segment(fields[1].decode())
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.task(task_id), _HASH_FIELDS)
        pipe.get(self.keys.result(task_id))
        pipe.zscore(self.keys.segment(queue_name, segment), task_id)
        (data, _, _, started_at, worker, lease_started, token, read_error), stored_result, score = pipe.execute()
        if data is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        row = [task_id.encode(), data, stored_result, started_at, worker, lease_started, token, read_error, score]
        return self._peeked(queue_name, segment, row)

    def check(self, **kwargs) -> list:
        from .checks import check_backend

        return check_backend(self)

    def ping(self) -> None:
        """Raise BackendConnectionError unless the server answers."""
        try:
            self.client.ping()
        except redis.RedisError as e:
            raise BackendConnectionError(f"Cannot reach the Redis server at {self.redis_url}: {e}") from e


from .broker import RedisBroker  # noqa: E402  (public name of this module)

__all__ = ["RedisBroker", "RedisTaskBackend", "default_worker_name"]
