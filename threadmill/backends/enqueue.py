"""Enqueueing: a call of a task prepared (encoded, given its id, partition and uniqueness) and stored.

`Enqueuer` does the work behind the backend's `enqueue`, `aenqueue`, `enqueue_many` and
`enqueue_scheduled`: one script call per batch of `ENQUEUE_BATCH` tasks per partition, retried
by `enqueue_retry` without storing a task twice (the script skips ids it holds), a unique
task's duplicate answered with the task holding its key, and `task_enqueued` sent for each
stored task with the backend's class as the sender. A full server's refusal is not retried:
it raises `ServerOutOfMemory` naming the server's maxmemory and policy. A workflow's one
script call (`send_workflow`) is retried and waited for (`wait_replicas`, `fsync_enqueue`) alike.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import redis
from asgiref.sync import sync_to_async
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json

from ..base import Segment, ThreadmillTaskResult
from ..exceptions import BackendConnectionError, ServerOutOfMemory
from ..integrations import otel
from ..limits import task_limit
from ..unique import UniqueSpec, spec_for
from . import codec
from .aio import send_task_enqueued
from .enqueue_retry import aretrying, naming, retrying
from .errors import out_of_memory, translate_errors
from .keys import PRIORITY_BAND, TASK_FIELDS
from .replication import wait_for_replicas
from .scripts import EnqueueReply

if TYPE_CHECKING:
    from ..schedules import Schedule
    from .aio import AsyncClients
    from .keys import KeySchema
    from .options import BackendOptions
    from .preflight import ServerReport
    from .scripts import RedisScripts

logger = logging.getLogger("threadmill.backend")

#: Most tasks `enqueue_many` stores in one script call.
ENQUEUE_BATCH = 1000


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


class EnqueueingBackend(Protocol):
    """What an `Enqueuer` uses of its backend (`RedisTaskBackend` is one)."""

    alias: str
    config: BackendOptions
    _layout_checked: bool

    @property
    def partition_count(self) -> int: ...

    @property
    def client(self) -> Any: ...

    @property
    def scripts(self) -> RedisScripts: ...

    @property
    def aio(self) -> AsyncClients: ...

    def next_enqueue_partition(self) -> int | None: ...

    def check_layout(self) -> None: ...

    def preflight(self) -> ServerReport: ...

    def scripts_for(self, partition: int) -> RedisScripts: ...

    def keys_for(self, partition: int) -> KeySchema: ...

    def task_keys(self, task_id: str) -> KeySchema: ...

    def validate_task(self, task: Any) -> None: ...

    def stored_result(self, result_id: str, fields: list, old_layout_result: bytes | None) -> ThreadmillTaskResult: ...


class Enqueuer:
    """Prepares and stores the tasks one backend enqueues."""

    def __init__(self, backend: EnqueueingBackend) -> None:
        self.backend = backend

    def enqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        """Enqueue one call of `task` (validated already), in a producer span when tracing is set up."""
        if otel.is_set_up():
            with otel.sending(self.backend.alias, task, 1) as trace:
                return self.enqueue_one(task, args, kwargs, trace)
        return self.enqueue_one(task, args, kwargs, None)

    def enqueue_one(self, task, args, kwargs, trace: dict[str, str] | None) -> ThreadmillTaskResult:
        prepared = self.prepare(task, args, kwargs, time.time(), self.backend.next_enqueue_partition(), trace)
        return self.enqueue_prepared(task, [prepared], prepared.partition)[0]

    async def aenqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        """`enqueue` on the running event loop's own connection (the task validated already)."""
        if otel.is_set_up():
            with otel.sending(self.backend.alias, task, 1) as trace:
                return await self.aenqueue_one(task, args, kwargs, trace)
        return await self.aenqueue_one(task, args, kwargs, None)

    async def aenqueue_one(self, task, args, kwargs, trace: dict[str, str] | None) -> ThreadmillTaskResult:
        prepared = self.prepare(task, args, kwargs, time.time(), self.backend.next_enqueue_partition(), trace)
        if prepared.partition is not None and not self.backend._layout_checked:
            await sync_to_async(self.backend.check_layout)()
        scripts = self.backend.scripts_for(prepared.partition or 0)

        def call(retried: bool) -> Awaitable[Any]:
            keys, script_args = scripts.enqueue_call(
                task.queue_name,
                [prepared.entry],
                int(prepared.now // 60),
                unique=[prepared.unique],
                task_limit=task_limit(task),
                retried=retried,
            )
            return self.backend.aio.run(scripts.enqueue_script, keys, script_args)

        try:
            raw, retries = await aretrying(
                self.backend.config.enqueue_retry, (prepared,), lambda: call(False), lambda: call(True)
            )
        except ServerOutOfMemory as e:
            raise await sync_to_async(self.refused_for_memory)(e, (prepared,)) from e.__cause__
        reply = EnqueueReply.read(raw).without_own([prepared])
        if retries:
            await sync_to_async(self.count_retries)(scripts.keys.totals(task.queue_name), retries, 1 - reply.stored)
        if reply.holders:
            return await sync_to_async(self.duplicate)(task, reply.holders[0], prepared)
        result = self.new_result(task, prepared)
        await send_task_enqueued(type(self.backend), result)
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
        self.backend.validate_task(task)
        # Partition 0, which holds the schedules hash the guard reads.
        partition = None if self.backend.partition_count == 1 else 0
        prepared = self.prepare(task, schedule.args, schedule.kwargs, time.time(), partition, pinned=True)
        guard = (schedule.name, "" if tick is None else repr(tick.timestamp()), schedule.timing, str(int(first_offer)))
        reply = self.backend.scripts.enqueue_many(
            task.queue_name,
            [prepared.entry],
            int(prepared.now // 60),
            schedule=guard,
            unique=[prepared.unique],
            task_limit=task_limit(task),
        )
        if not reply.stored:
            return None
        result = self.new_result(task, prepared)
        task_enqueued.send(type(self.backend), task_result=result)
        return result

    def enqueue_many(
        self, task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[ThreadmillTaskResult]:
        """Enqueue `task` once for each (args, kwargs) of `calls`, in one script call per `ENQUEUE_BATCH`.

        Every call's arguments are checked and encoded before anything is written, so bad
        arguments for one fail the whole call. Returns the results in the order of `calls`
        and sends `task_enqueued` for each stored one (a unique task's duplicate is returned
        as its holder, `duplicate` set). With partitions, each script call writes to one.
        The task is validated already.
        """
        calls = [_call(i, call) for i, call in enumerate(calls)]
        if otel.is_set_up():
            with otel.sending(self.backend.alias, task, len(calls)) as trace:
                return self.enqueue_calls(task, calls, trace)
        return self.enqueue_calls(task, calls, None)

    def enqueue_calls(
        self, task, calls: list[tuple[Any, Any]], trace: dict[str, str] | None
    ) -> list[ThreadmillTaskResult]:
        now = time.time()
        batches = []
        for start in range(0, len(calls), ENQUEUE_BATCH):
            partition = self.backend.next_enqueue_partition()
            batch = [self.prepare(task, *call, now, partition, trace) for call in calls[start : start + ENQUEUE_BATCH]]
            batches += [([start + i for i in indices], group) for indices, group in by_partition_of(batch)]
        results: list[ThreadmillTaskResult] = [None] * len(calls)  # type: ignore[list-item]
        for indices, batch in batches:
            for index, result in zip(indices, self.enqueue_prepared(task, batch, batch[0].partition), strict=True):
                results[index] = result
        return results

    def prepare(
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
            partition = int(unique.digest[:8], 16) % self.backend.partition_count
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

    def enqueue_prepared(
        self, task, prepared: list[PreparedTask], partition: int | None = None
    ) -> list[ThreadmillTaskResult]:
        # WAITAOF waits at most half the socket timeout, so the server's own "not yet" arrives
        # before the client would give the connection up as lost.
        config = self.backend.config
        durable_within_s = config.socket_timeout / 2 if config.fsync_enqueue else None
        if partition is not None:
            self.backend.check_layout()  # stamps the partitioned layout and this P before the first partitioned task
        entries = [p.entry for p in prepared]
        scripts = self.backend.scripts_for(partition or 0)
        unique = [p.unique for p in prepared] if getattr(task, "unique", False) else ()
        minute = int(prepared[0].now // 60)
        limit = task_limit(task)

        def send(retried: bool = False) -> EnqueueReply:
            reply = scripts.enqueue_many(
                task.queue_name, entries, minute, durable_within_s, unique=unique, task_limit=limit, retried=retried
            )
            if config.wait_replicas:
                # As WAITAOF's, the wait ends before the client would give the connection up as lost.
                ids = [p.id for p in prepared]
                translate_errors(wait_for_replicas)(
                    scripts,
                    scripts.keys.queues(),
                    config.wait_replicas,
                    config.socket_timeout / 2,
                    ids,
                )
            return reply

        try:
            reply, retries = retrying(config.enqueue_retry, entries, send, lambda: send(retried=True))
        except ServerOutOfMemory as e:
            raise self.refused_for_memory(e, entries) from e.__cause__
        reply = reply.without_own(prepared)
        if retries:
            self.count_retries(
                scripts.keys.totals(task.queue_name), retries, len(entries) - reply.stored - len(reply.holders)
            )
        duplicates = self.duplicates(task, reply.holders, prepared) if reply.holders else {}
        results = []
        for index, p in enumerate(prepared):
            if index in duplicates:
                results.append(duplicates[index])
                continue
            result = self.new_result(task, p)
            task_enqueued.send(type(self.backend), task_result=result)
            results.append(result)
        return results

    def send_workflow(
        self, workflow_id: str, name: str, graph: str, entries: list[tuple], partition: int | None = None
    ) -> int:
        """Send one enqueue_workflow call as a plain enqueue's: retried by `enqueue_retry`, then the waits.

        The call goes to the workflow's `partition` (None: one partition, the alias's own keys). A
        retry is safe: the script writes nothing when the workflow's record exists, and answers 0.
        Returns the script's reply (`WorkflowScripts.enqueue_workflow`).
        """
        if partition is not None:
            self.backend.check_layout()  # stamps the partitioned layout, as before a partitioned task
        config, scripts = self.backend.config, self.backend.scripts_for(partition or 0)
        durable_within_s = config.socket_timeout / 2 if config.fsync_enqueue else None

        def send() -> int:
            stored = int(scripts.enqueue_workflow(workflow_id, name, graph, entries, durable_within_s))
            if config.wait_replicas:
                ids = [entry[0] for entry in entries]
                wait_for_replicas(scripts, scripts.keys.queues(), config.wait_replicas, config.socket_timeout / 2, ids)
            return stored

        stored, retries = retrying(config.enqueue_retry, entries, send)
        if retries:
            # Counted in the first task's queue: the one call's retries belong to no single queue.
            already_stored = len(entries) if stored == 0 else 0
            self.count_retries(scripts.keys.totals(entries[0][2]), retries, already_stored)
        return stored

    def refused_for_memory(self, error: ServerOutOfMemory, entries: Sequence[Sequence[Any]]) -> ServerOutOfMemory:
        """Return a full server's refusal of `entries` naming its maxmemory and policy (the preflight's INFO).

        The INFO is read at most once per backend, and only here on the enqueue path: on a refusal.
        """
        try:
            report = self.backend.preflight()
        except BackendConnectionError:
            return error
        cause = error.__cause__
        if not isinstance(cause, redis.exceptions.OutOfMemoryError):
            return error
        return out_of_memory(cause, f"the enqueue of {naming(entries)}", report.maxmemory, report.policy)

    def count_retries(self, totals_key: str, retries: int, already_stored: int) -> None:
        """Count a retried enqueue call in its queue's totals (for metrics); a failure to count is only logged."""
        logger.info(
            "An enqueue call succeeded after %d retries (%d of its tasks were already stored).", retries, already_stored
        )
        try:
            pipe = self.backend.client.pipeline(transaction=False)
            pipe.hincrby(totals_key, "enqueue_retries", retries)
            if already_stored:
                pipe.hincrby(totals_key, "already_stored", already_stored)
            pipe.execute()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as e:
            logger.warning("Counting an enqueue call's %d retries failed: %s", retries, e)

    def duplicate(self, task, holder_id: str, prepared: PreparedTask) -> ThreadmillTaskResult:
        """Return the stored task `holder_id`, which holds the uniqueness key `prepared` asked for, as a duplicate."""
        return self.duplicates(task, {0: holder_id}, [prepared])[0]

    @translate_errors
    def duplicates(
        self, task, holders: dict[int, str], prepared: list[PreparedTask]
    ) -> dict[int, ThreadmillTaskResult]:
        """Read each entry's holder (entry index -> holder id) in one round trip, as duplicates."""
        ids = sorted(set(holders.values()))
        pipe = self.backend.client.pipeline(transaction=False)
        for holder in ids:
            keys = self.backend.task_keys(holder)
            pipe.hmget(keys.task(holder), TASK_FIELDS)
            pipe.get(keys.result(holder))
        replies = pipe.execute()
        stored: dict[str, ThreadmillTaskResult] = {}
        for i, holder in enumerate(ids):
            try:
                stored[holder] = self.backend.stored_result(holder, replies[2 * i], replies[2 * i + 1])
            except TaskResultDoesNotExist:
                pass  # removed (purged, expired) since the script call, where it held the key
        return {
            index: dataclasses.replace(
                stored.get(holder) or self.new_result(task, prepared[index]._replace(id=holder)), duplicate=True
            )
            for index, holder in holders.items()
        }

    def new_result(self, task, prepared: PreparedTask) -> ThreadmillTaskResult:
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
            backend=self.backend.alias,
            errors=[],
            worker_ids=[],
            segment=prepared.segment,
            unique_key=self.unique_key(prepared),
            trace_context=prepared.trace,
        )

    def unique_key(self, prepared: PreparedTask) -> str:
        return (
            ""
            if prepared.unique is None
            else self.backend.keys_for(prepared.partition or 0).unique(prepared.unique.digest)
        )
