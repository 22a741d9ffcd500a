"""`RedisTaskBackend`: a thin mapper between Django's TaskResult and the stored task.

Invariants: a task is in exactly one segment of its queue; its `data` is stored exactly
as enqueued and never rewritten by acquire (the lease lives in fields beside it); every
state change is one Lua script; a payload this code cannot read is quarantined in the
`unreadable` segment, never deleted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json
from redis.cluster import RedisCluster

from ..attempts import attempt_record
from ..base import (
    UNREADABLE_PAYLOAD_ERRORS,
    Segment,
    ThreadmillTask,
    ThreadmillTaskResult,
    return_value_of,
)
from ..exceptions import BackendConnectionError, ServerUnreachable, TaskCancelled, TaskTimeout, UnreadableTaskError
from ..identity import this_process_name
from ..integrations import otel
from ..limits import UNLIMITED, Acquired, LimitError, QueueLimit, check_partitions, encode, parse_rate, task_limit
from ..outcome import ended_by
from ..redaction import redact_text, redact_url
from ..schedules import Schedule, parse_schedules
from ..unique import UniqueSpec, spec_for
from . import codec, layout, preflight
from .aio import AsyncClients, send_task_enqueued
from .channel import TelemetrySubscription, publish
from .checks import check_backend, check_server
from .cluster import ClusterTransport
from .enqueue_retry import aretrying, retrying
from .errors import UNREACHABLE_ERRORS, translate_errors
from .keys import PRIORITY_BAND, TASK_FIELDS, KeySchema
from .options import parse_options
from .partitions import by_partition
from .preflight import ServerReport
from .replication import wait_for_replicas
from .routing import PartitionRouting
from .scripts import ENDED_BY_ABORT, ENDED_BY_TIME_LIMIT, EnqueueReply, RedisScripts
from .tooling import REQUEUE_ROUNDS, RedisTooling

logger = logging.getLogger("threadmill.backend")

#: Most tasks `enqueue_many` stores in one script call.
ENQUEUE_BATCH = 1000
#: Seconds a token that wakes one worker process is kept, should the process be gone.
WORKER_WAKE_TTL_S = 60
#: Most running entries of one queue `release_unanswered` looks through.
RELEASE_SCAN_LIMIT = 100_000


#: The letter acknowledge.lua counts a run by, by what ended it (`outcome.ended_by`).
_ENDED_BY: dict[type[BaseException] | None, str] = {TaskTimeout: ENDED_BY_TIME_LIMIT, TaskCancelled: ENDED_BY_ABORT}
#: Marks `acknowledge` called without a return value: the result's own is stored.
_ON_RESULT: Any = object()


class PreparedTask(NamedTuple):
    """A new task encoded for the enqueue script, with what its result needs."""

    id: str
    payload: str
    segment: Segment
    ready_score: str
    score: str
    args: Any
    kwargs: Any
    now: float
    #: Its uniqueness, None for a task that is not unique.
    unique: UniqueSpec | None = None
    #: The partition it is written to, None with one partition.
    partition: int | None = None
    #: The W3C trace context stored with it, None without tracing.
    trace: dict[str, str] | None = None

    @property
    def entry(self) -> tuple[str, str, Segment, str, str]:
        """What the enqueue script takes for this task: id, payload, segment, ready score, score."""
        return (self.id, self.payload, self.segment, self.ready_score, self.score)


class RequeueRead(NamedTuple):
    """A task as `requeue(task_id)` read it: the move is fenced by it, so a task that moved since stays."""

    task_id: str
    queue_name: str
    segment: str
    token: str
    document: str


def _call(index: int, call: Any) -> tuple[Any, Any]:
    """Return one (args, kwargs) element of enqueue_many's calls, or raise TypeError naming it."""
    try:
        args, kwargs = call
    except (TypeError, ValueError):
        raise TypeError(f"enqueue_many's calls[{index}] must be an (args, kwargs) pair, not {call!r}.") from None
    if isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence) or not isinstance(kwargs, Mapping):
        raise TypeError(f"enqueue_many's calls[{index}] must be a (list, dict) pair, not {call!r}.")
    return args, kwargs


def by_partition_of(batch: list[PreparedTask]) -> list[tuple[list[int], list[PreparedTask]]]:
    """Split one batch into the tasks of each partition it writes to, with their indices in the batch."""
    groups: dict[int | None, tuple[list[int], list[PreparedTask]]] = {}
    for index, prepared in enumerate(batch):
        indices, tasks = groups.setdefault(prepared.partition, ([], []))
        indices.append(index)
        tasks.append(prepared)
    return list(groups.values())


def _abort_request(stored: bytes) -> dict[str, Any]:
    """Read a stored abort request; one this code cannot read still asks to abort, by someone unnamed."""
    try:
        request = json.loads(stored)
        return {"by": str(request["by"]), "at": float(request["at"])}
    except (ValueError, TypeError, KeyError):
        return {"by": "someone", "at": time.time()}


def default_worker_name() -> str:
    """Return this process's lease holder name, `host:pid:incarnation` (see `threadmill.identity`)."""
    return this_process_name()


class RedisTaskBackend(PartitionRouting, RedisTooling, BaseTaskBackend):
    """Durable task backend on Redis or Valkey; see the README for the data model."""

    task_class = ThreadmillTask
    supports_defer = True
    supports_priority = True
    supports_async_task = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        redis_url = params.get("REDIS_URL")
        if not redis_url:
            raise ImproperlyConfigured(f"TASKS[{alias!r}] needs a REDIS_URL, such as 'redis://127.0.0.1:6379/0'.")
        self.redis_url: str = redis_url
        #: Whether REDIS_URL names a node of a Redis or Valkey Cluster (redis-py's cluster client).
        self.cluster = params.get("CLUSTER", False)
        if not isinstance(self.cluster, bool):
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['CLUSTER'] must be True or False, not {self.cluster!r}.")
        #: The parsed OPTIONS; `self.options` stays the mapping Django sets from them.
        self.config = parse_options(alias, params.get("OPTIONS", {}))
        unknown = sorted(set(self.config.limits) - set(self.queues)) if self.queues else []
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['limits'] names queue(s) {', '.join(unknown)} that are not in QUEUES "
                f"({', '.join(sorted(self.queues))})."
            )
        #: Each limited queue's setting as acquire reads it.
        self._limit_texts = {name: encode(limit) for name, limit in self.config.limits.items()}
        self.schedules = parse_schedules(alias, params.get("SCHEDULE"), zoneinfo.ZoneInfo(settings.TIME_ZONE or "UTC"))
        self.keys = KeySchema(alias)
        self._client: redis.Redis | RedisCluster | None = None
        self._scripts: RedisScripts | None = None
        self._aio: AsyncClients | None = None
        self._rotation = 0
        self._layout_checked = False
        self._preflight: ServerReport | None = None
        self._init_routing()

    # -- connection -------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The redis-py client (the cluster client with CLUSTER), created on first use (replies are bytes)."""
        if self._client is None:
            # A timeout on every read, so a hung server (SIGSTOP, a dead host) fails a call
            # instead of blocking its thread for good; the worker then backs off and retries.
            timeouts = {
                "socket_timeout": self.config.socket_timeout,
                "socket_connect_timeout": self.config.socket_timeout,
            }
            if self.cluster:
                # The cluster client reads the slot map on creation: no node answering is an outage.
                try:
                    self._client = RedisCluster.from_url(self.redis_url, decode_responses=False, **timeouts)
                except UNREACHABLE_ERRORS as e:
                    raise ServerUnreachable(
                        f"Cannot reach the Redis Cluster at {self.server_address}: {self._redacted(e)}"
                    ) from e
            else:
                self._client = redis.Redis.from_url(self.redis_url, decode_responses=False, **timeouts)
        return self._client

    @property
    def aio(self) -> AsyncClients:
        """The asyncio clients, one per running event loop."""
        if self._aio is None:
            self._aio = AsyncClients(self.redis_url, self.config.socket_timeout, cluster=self.cluster)
        return self._aio

    @property
    def scripts(self) -> RedisScripts:
        if self._scripts is None:
            client = self.client
            if isinstance(client, RedisCluster):
                transport = ClusterTransport(client)
                self._scripts = RedisScripts(client, self.keys, transport=transport, sharded_telemetry=True)
            else:
                self._scripts = RedisScripts(client, self.keys)
        return self._scripts

    # -- enqueue and results ----------------------------------------------------------

    def validate_task(self, task) -> None:
        """Django's checks, and a per-task limit no smaller than the partition count (each enforces a share)."""
        super().validate_task(task)
        concurrency, rate = getattr(task, "concurrency", None), getattr(task, "rate", None)
        if self.partition_count > 1 and (concurrency is not None or rate is not None):
            from django.tasks.exceptions import InvalidTask

            try:
                check_partitions(
                    QueueLimit(concurrency, None if rate is None else parse_rate(rate)), self.partition_count
                )
            except LimitError as e:
                raise InvalidTask(f"Task {task.module_path}: {e}") from None

    def enqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        self.validate_task(task)
        if otel.tracer is not None and otel.is_set_up():
            with otel.sending(self.alias, task, 1) as trace:
                return self._enqueue_one(task, args, kwargs, trace)
        return self._enqueue_one(task, args, kwargs, None)

    def _enqueue_one(self, task, args, kwargs, trace: dict[str, str] | None) -> ThreadmillTaskResult:
        prepared = self._prepare(task, args, kwargs, time.time(), self.next_enqueue_partition(), trace)
        return self._enqueue_prepared(task, [prepared], prepared.partition)[0]

    async def aenqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        """`enqueue` on the running event loop's own connection, without tying up a thread."""
        if self.config.fsync_enqueue or self.config.wait_replicas:
            # WAITAOF and WAIT must follow the write on the same connection: the thread path keeps one per thread.
            # Django's aenqueue returns what our `enqueue` does; its stub says only TaskResult.
            return await super().aenqueue(task, args, kwargs)  # type: ignore[return-value]
        self.validate_task(task)
        if otel.tracer is not None and otel.is_set_up():
            with otel.sending(self.alias, task, 1) as trace:
                return await self._aenqueue_one(task, args, kwargs, trace)
        return await self._aenqueue_one(task, args, kwargs, None)

    async def _aenqueue_one(self, task, args, kwargs, trace: dict[str, str] | None) -> ThreadmillTaskResult:
        prepared = self._prepare(task, args, kwargs, time.time(), self.next_enqueue_partition(), trace)
        if prepared.partition is not None and not self._layout_checked:
            await sync_to_async(self.check_layout)()
        scripts = self.scripts_for(prepared.partition or 0)
        keys, script_args = scripts.enqueue_call(
            task.queue_name,
            [prepared.entry],
            int(prepared.now // 60),
            unique=[prepared.unique],
            task_limit=task_limit(task),
        )
        raw, retries = await aretrying(
            self.config.enqueue_retry, (prepared,), lambda: self.aio.run(scripts.enqueue_script, keys, script_args)
        )
        reply = EnqueueReply.read(raw).without_own([prepared])
        if retries:
            await sync_to_async(self._count_retries)(scripts.keys.totals(task.queue_name), retries, 1 - reply.stored)
        if reply.holders:
            return await sync_to_async(self._duplicate)(task, reply.holders[0], prepared)
        result = self._new_result(task, prepared)
        await send_task_enqueued(type(self), result)
        return result

    def enqueue_scheduled(
        self, schedule: Schedule, tick: datetime | None, *, first_offer: bool = False
    ) -> ThreadmillTaskResult | None:
        """Enqueue one run of `schedule` for `tick` unless a run for it (or a later tick) was enqueued already.

        The check and the enqueue are one script call, so any number of brokers enqueue a tick
        once. `tick` None runs it now (an operator's "run now"), whatever the schedule's state.
        `first_offer` says the caller has not offered this schedule before: if the cron or zone
        recorded with the last tick differ, the schedule was edited and starts at its next tick.
        Returns the result, or None when the guard refused (paused, already enqueued, first sight, edited).
        """
        task = schedule.task()
        self.validate_task(task)
        # Partition 0, which holds the schedules hash the guard reads.
        partition = None if self.partition_count == 1 else 0
        prepared = self._prepare(task, schedule.args, schedule.kwargs, time.time(), partition, pinned=True)
        guard = (schedule.name, "" if tick is None else repr(tick.timestamp()), schedule.timing, str(int(first_offer)))
        reply = self.scripts.enqueue_many(
            task.queue_name,
            [prepared.entry],
            int(prepared.now // 60),
            schedule=guard,
            unique=[prepared.unique],
            task_limit=task_limit(task),
        )
        if not reply.stored:
            return None
        result = self._new_result(task, prepared)
        task_enqueued.send(type(self), task_result=result)
        return result

    def enqueue_many(
        self, task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[ThreadmillTaskResult]:
        """Enqueue `task` once for each (args, kwargs) of `calls`, in one script call per `ENQUEUE_BATCH`.

        Every call's arguments are checked and encoded before anything is written, so bad
        arguments for one fail the whole call. Returns the results in the order of `calls`
        and sends `task_enqueued` for each stored one (a unique task's duplicate is returned
        as its holder, `duplicate` set). With partitions, each script call writes to one.
        """
        self.validate_task(task)
        calls = [_call(i, call) for i, call in enumerate(calls)]
        if otel.tracer is not None and otel.is_set_up():
            with otel.sending(self.alias, task, len(calls)) as trace:
                return self._enqueue_calls(task, calls, trace)
        return self._enqueue_calls(task, calls, None)

    def _enqueue_calls(
        self, task, calls: list[tuple[Any, Any]], trace: dict[str, str] | None
    ) -> list[ThreadmillTaskResult]:
        now = time.time()
        batches = []
        for start in range(0, len(calls), ENQUEUE_BATCH):
            partition = self.next_enqueue_partition()
            batch = [self._prepare(task, *call, now, partition, trace) for call in calls[start : start + ENQUEUE_BATCH]]
            batches += [([start + i for i in indices], group) for indices, group in by_partition_of(batch)]
        results: list[ThreadmillTaskResult] = [None] * len(calls)  # type: ignore[list-item]
        for indices, batch in batches:
            for index, result in zip(indices, self._enqueue_prepared(task, batch, batch[0].partition), strict=True):
                results[index] = result
        return results

    def _prepare(
        self,
        task,
        args,
        kwargs,
        now: float,
        partition: int | None = None,
        trace: dict[str, str] | None = None,
        *,
        pinned: bool = False,
    ) -> PreparedTask:
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        unique = spec_for(task, args, kwargs)
        if unique is not None and partition is not None and not pinned:
            # Every enqueue of one key goes to one partition, whose keys hold it.
            partition = int(unique.digest[:8], 16) % self.partition_count
        task_id = codec.new_task_id(partition)
        payload = codec.encode_new(task, task_id, args, kwargs, now, trace)
        ready_score = f"{(100 - task.priority) * PRIORITY_BAND + int(now * 1000)}"
        if task.run_after is not None:
            segment, score = Segment.DEFERRED, repr(task.run_after.timestamp())
        else:
            segment, score = Segment.READY, ready_score
        return PreparedTask(
            task_id,
            payload,
            segment,
            ready_score,
            score,
            args,
            kwargs,
            now,
            unique=unique,
            partition=partition,
            trace=trace,
        )

    def _enqueue_prepared(
        self, task, prepared: list[PreparedTask], partition: int | None = None
    ) -> list[ThreadmillTaskResult]:
        # WAITAOF waits at most half the socket timeout, so the server's own "not yet" arrives
        # before the client would give the connection up as lost.
        durable_within_s = self.config.socket_timeout / 2 if self.config.fsync_enqueue else None
        if partition is not None:
            self.check_layout()  # stamps the partitioned layout and this P before the first partitioned task
        entries = [p.entry for p in prepared]
        scripts = self.scripts_for(partition or 0)
        unique = [p.unique for p in prepared] if getattr(task, "unique", False) else ()
        minute = int(prepared[0].now // 60)
        limit = task_limit(task)

        def send() -> EnqueueReply:
            reply = scripts.enqueue_many(
                task.queue_name, entries, minute, durable_within_s, unique=unique, task_limit=limit
            )
            if self.config.wait_replicas:
                # As WAITAOF's, the wait ends before the client would give the connection up as lost.
                ids = [p.id for p in prepared]
                translate_errors(wait_for_replicas)(
                    scripts, scripts.keys.queues(), self.config.wait_replicas, self.config.socket_timeout / 2, ids
                )
            return reply

        reply, retries = retrying(self.config.enqueue_retry, entries, send)
        reply = reply.without_own(prepared)
        if retries:
            self._count_retries(
                scripts.keys.totals(task.queue_name), retries, len(entries) - reply.stored - len(reply.holders)
            )
        duplicates = self._duplicates(task, reply.holders, prepared) if reply.holders else {}
        results = []
        for index, p in enumerate(prepared):
            if index in duplicates:
                results.append(duplicates[index])
                continue
            result = self._new_result(task, p)
            task_enqueued.send(type(self), task_result=result)
            results.append(result)
        return results

    def _count_retries(self, totals_key: str, retries: int, already_stored: int) -> None:
        """Count a retried enqueue call in its queue's totals (for metrics); a failure to count is only logged."""
        logger.info(
            "An enqueue call succeeded after %d retries (%d of its tasks were already stored).", retries, already_stored
        )
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(totals_key, "enqueue_retries", retries)
            if already_stored:
                pipe.hincrby(totals_key, "already_stored", already_stored)
            pipe.execute()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            logger.warning("Counting an enqueue call's %d retries failed: %s", retries, e)

    def _duplicate(self, task, holder_id: str, prepared: PreparedTask) -> ThreadmillTaskResult:
        """Return the stored task `holder_id`, which holds the uniqueness key `prepared` asked for, as a duplicate."""
        return self._duplicates(task, {0: holder_id}, [prepared])[0]

    @translate_errors
    def _duplicates(
        self, task, holders: dict[int, str], prepared: list[PreparedTask]
    ) -> dict[int, ThreadmillTaskResult]:
        """Read each entry's holder (entry index -> holder id) in one round trip, as duplicates."""
        ids = sorted(set(holders.values()))
        pipe = self.client.pipeline(transaction=False)
        for holder in ids:
            keys = self.task_keys(holder)
            pipe.hmget(keys.task(holder), TASK_FIELDS)
            pipe.get(keys.result(holder))
        replies = pipe.execute()
        stored: dict[str, ThreadmillTaskResult] = {}
        for i, holder in enumerate(ids):
            try:
                stored[holder] = self._stored_result(holder, replies[2 * i], replies[2 * i + 1])
            except TaskResultDoesNotExist:
                pass  # removed (purged, expired) since the script call, where it held the key
        return {
            index: dataclasses.replace(
                stored.get(holder) or self._new_result(task, prepared[index]._replace(id=holder)), duplicate=True
            )
            for index, holder in holders.items()
        }

    def _new_result(self, task, prepared: PreparedTask) -> ThreadmillTaskResult:
        return ThreadmillTaskResult(
            task=task,
            id=prepared.id,
            status=TaskResultStatus.READY,
            enqueued_at=datetime.fromtimestamp(prepared.now, UTC),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=prepared.args,
            kwargs=prepared.kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
            segment=prepared.segment,
            unique_key=self._unique_key(prepared),
            trace_context=prepared.trace,
        )

    def _unique_key(self, prepared: PreparedTask) -> str:
        return "" if prepared.unique is None else self.keys_for(prepared.partition or 0).unique(prepared.unique.digest)

    @translate_errors
    def get_result(self, result_id: str) -> ThreadmillTaskResult:
        """Return the task's current state whatever its segment, or raise TaskResultDoesNotExist."""
        keys = self.task_keys(result_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(keys.task(result_id), TASK_FIELDS)
        pipe.get(keys.result(result_id))
        fields, old_layout_result = pipe.execute()
        return self._stored_result(result_id, fields, old_layout_result)

    async def aget_result(self, result_id: str) -> ThreadmillTaskResult:
        """`get_result` on the running event loop's own connection, without a thread."""
        keys = self.task_keys(result_id)
        fields, old_layout_result = await self.aio.read_task(keys.task(result_id), keys.result(result_id), TASK_FIELDS)
        return self._stored_result(result_id, fields, old_layout_result)

    def _stored_result(self, result_id: str, fields: list, old_layout_result: bytes | None) -> ThreadmillTaskResult:
        # A result lives in the task hash; layout 1 kept it in a key of its own, read until it expires.
        data, _, segment, started_at, worker, lease_started, token, read_error, stored_result = fields[:9]
        progress, metadata, attempts, unique_key = fields[9:13]
        stored_result = stored_result or old_layout_result
        if data is None:
            raise TaskResultDoesNotExist(f"No task with id {result_id!r} is stored.")
        segment = Segment(segment.decode())
        if segment is Segment.UNREADABLE:
            raise UnreadableTaskError(f"Task {result_id} is unreadable: {codec.text(read_error)}")
        lease_start = codec.moment(lease_started)
        try:
            return codec.decode(
                stored_result or data,
                segment,
                started_at=started_at,
                lease_worker=codec.text(worker),
                lease_started_at=lease_start,
                lease_token=codec.text(token),
                progress=progress,
                metadata=metadata,
                attempts=attempts,
                unique_key=self.task_keys(result_id).unique(unique_key.decode()) if unique_key else "",
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            raise UnreadableTaskError(f"Task {result_id} cannot be read: {e!r}") from e

    # -- the worker's verbs -----------------------------------------------------------

    def acquire(
        self,
        *queue_names: str,
        count: int = 1,
        worker: str = "",
        timeout: timedelta | None = None,
        token_base: str = "",
    ) -> Acquired:
        """Lease up to `count` ready tasks round-robin across `queue_names` in one atomic call.

        With `timeout` None this tries once; with a timedelta it polls with exponential
        backoff until a task arrives or the time is up. An empty list means none arrived.
        Payloads this code cannot read are quarantined and not returned. Each lease's
        token starts with `token_base` (random unless given), so the leases of a call whose
        reply was lost can be found again with `release_unanswered`.
        """
        queues = list(queue_names) or sorted(self.queues)
        worker = worker or default_worker_name()
        deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
        pause = self.config.poll_interval
        while True:
            results = self._acquire_once(queues, count, worker, token_base or os.urandom(6).hex())
            if results or deadline is None:
                return results
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return results
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, self.config.poll_max_interval)

    def _acquire_once(self, queues: list[str], count: int, worker: str, token_base: str) -> Acquired:
        shift = self._rotation % len(queues)
        self._rotation += 1
        rotated = queues[shift:] + queues[:shift]
        limits = [self._limit_texts.get(q, UNLIMITED) for q in rotated]
        partitions = len(self.covered_partitions())
        results = Acquired()
        if partitions == 1:
            reply = self.scripts.acquire(rotated, count, worker, self.config.lease_ttl, token_base, limits)
            results.hold(reply[-1])
        else:
            for partition in self.empty_hints.order(partitions):
                reply = self.scripts_for(partition).acquire(
                    rotated, count, worker, self.config.lease_ttl, token_base, limits, partitions
                )
                results.hold(reply[-1])
                leased = (len(reply) - 3) // 6
                self.empty_hints.came_back(partition, full=leased >= count)
                if leased:
                    break
        now = int(reply[0]) + int(reply[1]) / 1e6
        lease_start = datetime.fromtimestamp(now, UTC)
        deadline = datetime.fromtimestamp(now + self.config.lease_ttl, UTC)
        for i in range(2, len(reply) - 1, 6):
            task_id, data, started_at, token = reply[i].decode(), reply[i + 1], reply[i + 2], reply[i + 3].decode()
            losses = reply[i + 5]
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
                        worker_losses=None if losses is None else int(losses),
                    )
                )
            except UNREADABLE_PAYLOAD_ERRORS as e:
                self.quarantine_unreadable(
                    task_id, rotated[int(reply[i + 4]) - 1], Segment.RUNNING, e, token, "acquire"
                )
        return results

    def acknowledge(self, result: ThreadmillTaskResult, return_value: Any = _ON_RESULT) -> bool:
        """Store a finished result and release its lease; False when the fence refused it.

        Without `return_value`, the value the result carries is stored (Django's
        `TaskResult.return_value` of a successful result).
        """
        if return_value is _ON_RESULT:
            return_value = return_value_of(result)
        return self.acknowledge_many([(result, return_value)])[0]

    def acknowledge_many(self, outcomes: Sequence[tuple[ThreadmillTaskResult, Any]]) -> list[bool]:
        """Acknowledge several finished results in one script call, each fenced by its lease token."""
        entries = []
        for result, return_value in outcomes:
            segment = Segment.SUCCESSFUL if result.status == TaskResultStatus.SUCCESSFUL else Segment.FAILED
            document = codec.encode_result(result, return_value)
            end = _ENDED_BY.get(ended_by(result), "-")
            record = attempt_record(result)
            unique = getattr(result.task, "unique", False)
            entries.append(
                (result.id, result.task.queue_name, result.lease_token, document, segment, end, record, unique)
            )
        minute = int(time.time() // 60)
        if len(self.covered_partitions()) == 1:
            accepted = self.scripts.acknowledge(entries, self.config.result_ttl, minute)
        else:
            by_id: dict[str, Any] = {}
            for partition, group in by_partition(entries, lambda entry: entry[0]).items():
                replies = self.scripts_for(partition).acknowledge(group, self.config.result_ttl, minute)
                by_id.update(zip((entry[0] for entry in group), replies, strict=True))
            accepted = [by_id[entry[0]] for entry in entries]
        for (result, _), ok in zip(outcomes, accepted, strict=True):
            if not ok:
                logger.warning(
                    "Acknowledgement of task %s refused: it no longer holds lease %s (taken back by the broker, "
                    "or already acknowledged by a call whose reply was lost).",
                    result.id,
                    result.lease_token,
                )
        return [bool(ok) for ok in accepted]

    def release(self, results: Sequence[ThreadmillTaskResult]) -> int:
        """Hand leased tasks that never started back to ready, where they were, with no attempt recorded.

        Fenced per task by its lease token: a task whose lease was taken over is left alone.
        Returns how many went back.
        """
        if not results:
            return 0
        leases = [(r.id, r.task.queue_name, r.lease_token) for r in results]
        return sum(
            self.task_scripts(group[0][0]).release(group)
            for group in by_partition(leases, lambda lease: lease[0]).values()
        )

    def record_progress(self, result: ThreadmillTaskResult, stage: str) -> bool:
        """Record on the server that a suspect's run has "started" or "finished" under its lease.

        One round trip, made only for a suspect (`worker_losses` set), so a loss of this worker
        is blamed exactly. False when the fence refused it: the lease was taken back.
        """
        return self.task_scripts(result.id).record_progress(result.id, result.lease_token, stage) == 1

    def extend_lease(self, result: ThreadmillTaskResult, cover_s: float) -> bool:
        """Make a running task's lease last at least `cover_s` seconds from now; False when it was taken back.

        One round trip, made only before a run whose time limit and grace outlast its lease.
        """
        scripts = self.task_scripts(result.id)
        deadline = scripts.extend_lease(result.id, result.task.queue_name, result.lease_token, cover_s)
        if deadline is None:
            return False
        object.__setattr__(result, "lease_deadline", codec.moment(deadline))
        return True

    def record_task_stats(self, counts: dict[str, dict[str, dict[str, int]]]) -> int:
        """Add a worker's per-task-path counts ({queue: {path: {name: n}}}, `taskstats`) in one call on partition 0."""
        return self.scripts.record_task_stats(counts, int(time.time() // 60)) if counts else 0

    def report(self, entries: Sequence[tuple[str, str, str, str, bool]]) -> list:
        """Store what running tasks reported (see `threadmill.progress`), one script call a partition.

        Each entry is (task id, lease token, progress, metadata, merged), fenced by its token;
        returns a reply per entry in order: 1 stored, 0 refused, or the stored metadata to merge first.
        """
        replies: list[Any] = [0] * len(entries)
        for group in by_partition(enumerate(entries), lambda item: item[1][0]).values():
            answered = self.task_scripts(group[0][1][0]).report([entry for _, entry in group])
            for (i, _), reply in zip(group, answered, strict=True):
                replies[i] = reply
        return replies

    def aborts_requested(self, results: Sequence[ThreadmillTaskResult]) -> dict[str, dict[str, Any]]:
        """Return the abort requests stored for these leases (see `cancel`): lease token -> {"by", "at"}.

        Read only, one script call a partition; a lease taken back since reads as no request.
        """
        requests: dict[str, dict[str, Any]] = {}
        leases = [(r.id, r.lease_token) for r in results]
        for group in by_partition(leases, lambda lease: lease[0]).values():
            stored_requests = self.task_scripts(group[0][0]).aborts_requested(group)
            for (_, token), stored in zip(group, stored_requests, strict=True):
                if stored:
                    requests[token] = _abort_request(stored)
        return requests

    def release_unanswered(self, queue_names: Sequence[str], token_bases: Sequence[str]) -> int:
        """Hand back to ready the leases that acquire calls with these token bases took; return how many.

        For calls whose reply never arrived (a timeout, a dropped connection): the server may
        have run them, leasing tasks to a worker that never saw them.
        """
        if not token_bases:
            return 0
        return sum(
            self.scripts_for(partition).release_unanswered(list(queue_names), list(token_bases), RELEASE_SCAN_LIMIT)
            for partition in self.covered_partitions()
        )

    def wait_for_tasks(self, queue_names: Sequence[str], worker: str, timeout_s: float) -> bool:
        """Block until a task may be ready on one of the queues, `worker` is woken, or `timeout_s` passes.

        Returns True when woken. Waking leases nothing: the caller acquires as usual.
        """
        return self.wait_on_partitions(queue_names, worker, timeout_s)

    def pass_wake_on(self, queue_names: Sequence[str]) -> None:
        """Wake an idle worker in each partition whose ready tasks have no wake token (one this process took, unused)."""
        for partition in self.covered_partitions():
            self.scripts_for(partition).pass_wake(queue_names)

    @translate_errors
    def wake_worker(self, worker: str) -> None:
        """Wake `worker` if it waits for tasks (so it notices a stop at once)."""
        key = self.keys.worker_wake(worker)
        pipe = self.client.pipeline(transaction=True)
        pipe.lpush(key, "1")
        pipe.expire(key, WORKER_WAKE_TTL_S)
        pipe.execute()

    def heartbeat(self, worker: str, document: dict[str, Any] | None, *, publish: bool = True) -> float:
        """Record that `worker` is alive with its `document` (also published as telemetry); return the server time.

        `document` None says goodbye: the worker handed everything back and leaves the workers set.
        The document outlives the heartbeat by `lease_ttl`, so the broker can still read a dead worker's.
        """
        text = "" if document is None else json.dumps(document)
        ttl = self.config.lease_ttl + self.config.worker_timeout
        return float(self.scripts.heartbeat(worker, text, ttl, publish))

    @translate_errors
    def publish_telemetry(self, text: str) -> None:
        """Publish one telemetry message on the alias's channel (sharded on a cluster)."""
        publish(self.client, self.keys.telemetry(), text, sharded=self.cluster)

    def subscribe_telemetry(self, channels: Sequence[str]) -> TelemetrySubscription:
        """Subscribe to telemetry channels on this backend's server (sharded on a cluster)."""
        return TelemetrySubscription(self.client, channels, sharded=self.cluster)

    def requeue(self, task: str | TaskResult, *, run_after: datetime | timedelta | None = None) -> bool:
        """Move a task back to ready (or to deferred with `run_after`), keeping its id.

        Given an id, the stored payload is kept as it is (it may be unreadable), except that
        a running task's abandoned attempt is recorded in it: its worker id stays in
        `worker_ids` and an `AttemptAbandoned` error says so (fenced by the lease it was read
        under). Given a TaskResult, its errors and worker ids are stored with it and the call
        is fenced by its lease token. Returns False when there is no such task, it is
        already ready, or the fence refused it.
        """
        at = self._run_after_seconds(run_after)
        if isinstance(task, TaskResult):
            token = getattr(task, "lease_token", "")
            reply = self.task_scripts(task.id).requeue(
                task.id,
                task.task.queue_name,
                run_after=at,
                token=token,
                document=codec.encode_result(task),
                # A worker's retry of a run its time limit ended (a result read back carries no lease).
                counted="timed_out" if token and ended_by(task) is TaskTimeout else "",
                record=attempt_record(task) if token and isinstance(task, ThreadmillTaskResult) else "",
            )
        else:
            return self._requeue_by_id(task, at) == 1
        if reply == -1:
            logger.warning("Requeue of task %s refused: its lease was taken over.", task.id)
        return reply == 1

    def _requeue_by_id(self, task_id: str, at: float | None) -> int:
        # Read, then move fenced by what was read; a running task leased again in between is read again.
        reply = -1
        for _ in range(REQUEUE_ROUNDS):
            read = self.read_for_requeue(task_id)
            if read is None:
                return 0
            reply = self.requeue_as_read(read, at)
            if reply != -1 or read.segment != "running":
                return reply
        logger.warning(
            "Requeue of task %s refused: it was leased again each of the %d times it was read.",
            task_id,
            REQUEUE_ROUNDS,
        )
        return reply

    def read_for_requeue(self, task_id: str) -> RequeueRead | None:
        """Read what `requeue(task_id)` moves the task by; None when there is no such task.

        A running task is read with its lease applied, and its abandoned attempt recorded in the new document.
        """
        fields = translate_errors(self.client.hmget)(self.task_keys(task_id).task(task_id), TASK_FIELDS)
        if fields[1] is None:
            return None
        queue_name, segment = fields[1].decode(), codec.text(fields[2])
        if segment != "running":
            return RequeueRead(task_id, queue_name, segment, "", "")
        document = self.abandoned_document(task_id, queue_name, fields, "requeue(task_id)")
        return RequeueRead(task_id, queue_name, segment, codec.text(fields[6]), document)

    def requeue_as_read(self, read: RequeueRead, at: float | None) -> int:
        """Move a task as `read_for_requeue` read it: 1 moved, 0 already ready or gone, -1 refused (it moved)."""
        scripts = self.task_scripts(read.task_id)
        reply = scripts.requeue(
            read.task_id, read.queue_name, run_after=at, token=read.token, document=read.document, segment=read.segment
        )
        if reply == -1 and read.segment != "running":
            logger.warning(
                "Requeue of task %s refused: it left the %s segment since it was read (a worker may run it now); "
                "it stays where it is.",
                read.task_id, read.segment,
            )  # fmt: skip
        return reply

    @staticmethod
    def _run_after_seconds(run_after: datetime | timedelta | None) -> float | None:
        if run_after is None:
            return None
        if isinstance(run_after, timedelta):
            return time.time() + run_after.total_seconds()
        return run_after.timestamp()

    def check(self, **kwargs) -> list:
        return check_backend(self.alias, self.redis_url, self.config) + check_server(self.preflight)

    @translate_errors
    def server_time(self) -> datetime:
        """Return the server's clock (every lease, heartbeat and schedule decision uses it)."""
        seconds, micros = self.client_for(self.keys.workers()).time()
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    def check_layout(self) -> None:
        """Check, once per backend instance, that the alias's data layout is one this code reads; record or upgrade it.

        Raises LayoutVersionError naming the stored version, this code's and what to do.
        """
        if not self._layout_checked:
            partitioned = self.partition_count > 1
            translate_errors(layout.check_layout)(self.client, self.keys.layout(), self.alias, partitioned=partitioned)
            self.record_partitions()
            self._layout_checked = True

    @property
    def server_address(self) -> str:
        """REDIS_URL as every message shows it: its password and secret parameters masked."""
        return redact_url(self.redis_url)

    def _redacted(self, error: Exception) -> str:
        return redact_text(str(error), [self.redis_url])

    def preflight(self) -> ServerReport:
        """Read the server's version, memory policy and persistence (one INFO) and judge them, once per instance."""
        if self._preflight is None:
            client = self.client_for(self.keys.workers())
            info, unread = translate_errors(preflight.read_info)(client)
            self._preflight = preflight.assess(info, self.server_address, unread)
        return self._preflight

    def ping(self) -> None:
        """Raise BackendConnectionError unless the server answers."""
        try:
            self.client.ping()
        except redis.RedisError as e:
            raise BackendConnectionError(
                f"Cannot reach the Redis server at {self.server_address}: {self._redacted(e)}"
            ) from e


__all__ = ["RedisTaskBackend", "default_worker_name"]
