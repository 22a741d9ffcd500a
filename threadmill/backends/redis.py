"""`RedisTaskBackend`: a thin mapper between Django's TaskResult and the stored task.

Invariants: a task is in exactly one segment of its queue; its `data` is stored exactly
as enqueued and never rewritten by acquire (the lease lives in fields beside it); every
state change is one Lua script; a payload this code cannot read is quarantined in the
`unreadable` segment, never deleted.
"""

from __future__ import annotations

import logging
import time
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import TaskResultDoesNotExist
from redis.cluster import RedisCluster

from ..attempts import attempt_record
from ..base import (
    UNREADABLE_PAYLOAD_ERRORS,
    Segment,
    ThreadmillTask,
    ThreadmillTaskResult,
)
from ..exceptions import BackendConnectionError, ResultTrimmed, ServerUnreachable, TaskTimeout, UnreadableTaskError
from ..identity import this_process_name
from ..limits import LimitError, QueueLimit, check_partitions, encode, parse_rate
from ..outcome import ended_by
from ..redaction import redact_text, redact_url
from . import clients, codec, layout, preflight
from .aio import AsyncClients
from .checks import KEYWORD_ERRORS, check_backend, check_server
from .cluster import ClusterTransport
from .enqueue import Enqueuer
from .errors import UNREACHABLE_ERRORS, translate_errors
from .keys import TASK_FIELDS, KeySchema
from .options import parse_options
from .preflight import ServerReport
from .routing import PartitionRouting
from .scripts import RedisScripts
from .sentinel import is_sentinel_url
from .tooling import REQUEUE_ROUNDS, RedisTooling
from .worker_verbs import WorkerVerbs
from .workflows import WorkflowBackend

if TYPE_CHECKING:
    from ..schedules import Schedule

logger = logging.getLogger("threadmill.backend")


def _schedules(alias: str, raw: Any) -> tuple[Schedule, ...]:
    """Return the alias's `SCHEDULE` setting parsed; an alias without one does not import the schedules module."""
    if raw is None:
        return ()
    from ..schedules import parse_schedules  # cronsim and the schedule rules: only where a schedule is set

    return parse_schedules(alias, raw, zoneinfo.ZoneInfo(settings.TIME_ZONE or "UTC"))


class RequeueRead(NamedTuple):
    """A task as `requeue(task_id)` read it: the move is fenced by it, so a task that moved since stays."""

    task_id: str
    queue_name: str
    segment: str
    token: str
    document: str


def default_worker_name() -> str:
    """Return this process's lease holder name, `host:pid:incarnation` (see `threadmill.identity`)."""
    return this_process_name()


class RedisTaskBackend(WorkerVerbs, PartitionRouting, RedisTooling, WorkflowBackend, BaseTaskBackend):
    """Durable task backend on Redis or Valkey; its data model is docs/reference/data-model.md."""

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
        if self.cluster and is_sentinel_url(redis_url):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}] has CLUSTER True and a redis+sentinel:// REDIS_URL; a cluster has no Sentinel. "
                "Name a node of the cluster, or set CLUSTER False."
            )
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
        self.schedules = _schedules(alias, params.get("SCHEDULE"))
        self.keys = KeySchema(alias)
        self._client: redis.Redis | RedisCluster | None = None
        self._scripts: RedisScripts | None = None
        self._aio: AsyncClients | None = None
        #: Prepares and stores what this backend enqueues.
        self.enqueuer = Enqueuer(self)
        self._rotation = 0
        self._layout_checked = False
        self._preflight: ServerReport | None = None
        self._init_routing()

    # -- connection -------------------------------------------------------------------

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The redis-py client (the cluster client with CLUSTER), created on first use (replies are bytes)."""
        if self._client is None:
            try:
                # The cluster client reads the slot map on creation: no node answering is an outage.
                self._client = clients.sync_client(self.redis_url, self.config, cluster=self.cluster)
            except UNREACHABLE_ERRORS as e:
                raise ServerUnreachable(
                    f"Cannot reach the Redis Cluster at {self.server_address}: {self._redacted(e)}"
                ) from e
        return self._client

    @property
    def aio(self) -> AsyncClients:
        """The asyncio clients, one per running event loop."""
        if self._aio is None:
            url, config, cluster = self.redis_url, self.config, self.cluster
            self._aio = AsyncClients(
                lambda: clients.async_client(url, config, cluster=cluster), config.socket_timeout, cluster=cluster
            )
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
        if self.partition_count == 1:
            return
        concurrency, rate = getattr(task, "concurrency", None), getattr(task, "rate", None)
        if concurrency is not None or rate is not None:
            from django.tasks.exceptions import InvalidTask

            try:
                check_partitions(
                    QueueLimit(concurrency, None if rate is None else parse_rate(rate)), self.partition_count
                )
            except LimitError as e:
                raise InvalidTask(f"Task {task.module_path}: {e}") from None

    def enqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        self.validate_task(task)
        return self.enqueuer.enqueue(task, args, kwargs)

    async def aenqueue(self, task, args, kwargs) -> ThreadmillTaskResult:
        """`enqueue` on the running event loop's own connection, without tying up a thread."""
        if self.config.fsync_enqueue or self.config.wait_replicas:
            # WAITAOF and WAIT must follow the write on the same connection: the thread path keeps one per thread.
            # Django's aenqueue returns what our `enqueue` does; its stub says only TaskResult.
            return await super().aenqueue(task, args, kwargs)  # type: ignore[return-value]
        self.validate_task(task)
        return await self.enqueuer.aenqueue(task, args, kwargs)

    def enqueue_scheduled(
        self, schedule: Schedule, tick: datetime | None, *, first_offer: bool = False
    ) -> ThreadmillTaskResult | None:
        """Enqueue one run of `schedule` for `tick` unless a run for it was enqueued already (`Enqueuer.enqueue_scheduled`)."""
        return self.enqueuer.enqueue_scheduled(schedule, tick, first_offer=first_offer)

    def enqueue_many(
        self, task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[ThreadmillTaskResult]:
        """Enqueue `task` once for each (args, kwargs) of `calls`, checked before anything is written (`Enqueuer.enqueue_many`)."""
        self.validate_task(task)
        return self.enqueuer.enqueue_many(task, calls)

    @translate_errors
    def get_result(self, result_id: str) -> ThreadmillTaskResult:
        """Return the task's current state whatever its segment, or raise TaskResultDoesNotExist."""
        keys = self.task_keys(result_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(keys.task(result_id), TASK_FIELDS)
        pipe.get(keys.result(result_id))
        fields, old_layout_result = pipe.execute()
        if fields[0] is None:  # only a miss pays the tombstone's read
            raise self.missing(result_id, self.client.zscore(keys.trimmed(), result_id))
        return self.stored_result(result_id, fields, old_layout_result)

    async def aget_result(self, result_id: str) -> ThreadmillTaskResult:
        """`get_result` on the running event loop's own connection, without a thread."""
        keys = self.task_keys(result_id)
        fields, old_layout_result = await self.aio.read_task(keys.task(result_id), keys.result(result_id), TASK_FIELDS)
        if fields[0] is None:
            raise self.missing(result_id, await self.aio.zscore(keys.trimmed(), result_id))
        return self.stored_result(result_id, fields, old_layout_result)

    @staticmethod
    def missing(result_id: str, trimmed_at: float | None) -> TaskResultDoesNotExist:
        """Return the error for a task whose hash is gone: ResultTrimmed when a full server's trimmer dropped it."""
        if trimmed_at is None:
            return TaskResultDoesNotExist(f"No task with id {result_id!r} is stored.")
        finished = datetime.fromtimestamp(trimmed_at, UTC).isoformat()
        return ResultTrimmed(
            f"Task {result_id} finished SUCCESSFUL at {finished}, but its result was trimmed: the server was over "
            "its maxmemory, so the oldest successful results were dropped to keep it draining."
        )

    def stored_result(self, result_id: str, fields: list, old_layout_result: bytes | None) -> ThreadmillTaskResult:
        """Return the task a read of its hash (`TASK_FIELDS`) and its layout-1 result key found; TaskResultDoesNotExist when none."""
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
            result = codec.decode(
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
            upstream = fields[13] if len(fields) > 13 else None
            return result if upstream is None else codec.with_upstream_failure(result, upstream)
        except UNREADABLE_PAYLOAD_ERRORS as e:
            raise UnreadableTaskError(f"Task {result_id} cannot be read: {e!r}") from e

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
        found = check_backend(self.alias, self.redis_url, self.config, cluster=self.cluster)
        if any(error.id in KEYWORD_ERRORS for error in found):
            return found  # a client made with a keyword redis-py refuses raises TypeError: no preflight
        return found + check_server(self.preflight)

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

    def preflight(self, *, fresh: bool = False) -> ServerReport:
        """Read the server's version, memory policy and persistence (one INFO) and judge them, once per instance.

        `fresh` reads them again (a status read: whether the server is full now).
        """
        if self._preflight is None or fresh:
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
