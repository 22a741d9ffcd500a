"""One named Python wrapper for each Lua script; each call is one atomic operation.

The wrappers take key names already built by `KeySchema` and return the script's
reply as it comes (bytes). Driver errors become `BackendConnectionError` here
(`errors.translate_errors`); connections are the transport's (`transport.py`). This module
holds the task path's wrappers (enqueue, acquire, acknowledge, requeue, the worker's calls);
the broker's are in `maintenance_scripts.py`, the tooling API's in `tooling_scripts.py`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from ..base import Segment
from ..exceptions import DurableEnqueueError
from ..limits import TASK_LIMIT_LOOK
from . import taskstats
from .errors import translate_errors
from .keys import THROUGHPUT_COUNTER_TTL_S, KeySchema
from .maintenance_scripts import MaintenanceScripts
from .options import DEFAULT_RESULT_TTL_S
from .script_source import LuaScript
from .tooling_scripts import ToolingScripts
from .transport import ServerTransport
from .workflow_scripts import WorkflowScripts

if TYPE_CHECKING:
    from ..unique import UniqueSpec

_SEGMENT_ORDER = (
    Segment.READY,
    Segment.DEFERRED,
    Segment.RUNNING,
    Segment.SUCCESSFUL,
    Segment.FAILED,
    Segment.UNREADABLE,
)


#: Letters of acknowledge.lua's optional argument: a run its time limit ended, or an abort.
ENDED_BY_TIME_LIMIT = "t"
ENDED_BY_ABORT = "a"


class EnqueueReply(NamedTuple):
    """What the enqueue script answered: how many tasks it stored, and the holder of each duplicate's key."""

    stored: int
    #: Index of an entry in the call (from 0) -> the id of the task that holds its uniqueness key.
    holders: dict[int, str]

    def without_own(self, prepared: Sequence[Any]) -> EnqueueReply:
        """Drop the entries whose key holder is the entry itself: stored by a retried call's first attempt."""
        if not self.holders:
            return self
        own = {index: holder for index, holder in self.holders.items() if holder == prepared[index].id}
        if not own:
            return self
        return EnqueueReply(self.stored, {i: h for i, h in self.holders.items() if i not in own})

    @classmethod
    def read(cls, reply: int | list) -> EnqueueReply:
        if isinstance(reply, int):
            return cls(reply, {})
        pairs = reply[1:]
        return cls(int(reply[0]), {int(pairs[i]) - 1: pairs[i + 1].decode() for i in range(0, len(pairs), 2)})


class RedisScripts(ToolingScripts, MaintenanceScripts, WorkflowScripts):
    """The backend's Lua scripts over one partition's keys, each call sent through a transport.

    The transport (`transport.ServerTransport`, or `cluster.ClusterTransport` on a cluster) owns
    the connections; copies for other partitions (`for_partition`) share it.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: KeySchema,
        *,
        transport: ServerTransport | None = None,
        sharded_telemetry: bool = False,
    ) -> None:
        self.keys = keys
        self.client = client
        self.transport = ServerTransport(client) if transport is None else transport
        #: The scripts' publish flag: "1" publishes telemetry with SPUBLISH (a cluster's sharded pub/sub).
        self.sharded_flag = "1" if sharded_telemetry else "0"
        register = LuaScript.named
        self._enqueue = register("enqueue")
        self._acquire = register("acquire")
        self._acknowledge = register("acknowledge")
        self._requeue = register("requeue")
        self._quarantine = register("quarantine")
        self._promote = register("promote")
        self._claim_expired = register("claim_expired")
        self._purge = register("purge")
        self._delete = register("delete")
        self._peek = register("peek")
        self._peek_matching = register("peek_matching")
        self._peek_after = register("peek_after")
        self._requeue_many = register("requeue_many")
        self._heartbeat = register("heartbeat")
        self._pause = register("pause")
        self._take_control = register("take_control")
        self._send_control = register("send_control")
        self._wake_worker = register("wake_worker")
        self._trim_full = register("trim_full")
        self._copy_paused = register("copy_paused")
        self._pause_schedule = register("pause_schedule")
        self._sample_latency = register("sample_latency")
        self._resume = register("resume")
        self._claim_abandoned = register("claim_abandoned")
        self._release = register("release")
        self._release_unanswered = register("release_unanswered")
        self._record_progress = register("record_progress")
        self._extend_lease = register("extend_lease")
        self._report = register("report")
        self._cancel = register("cancel")
        self._aborts_requested = register("aborts_requested")
        self._trim_finished = register("trim_finished")
        self._live_leases = register("live_leases")
        self._scan = register("scan")
        self._pass_wake = register("pass_wake")
        self._record_task_stats = register("record_task_stats")
        self._limit = register("limit")
        self._limit_state = register("limit_state")
        self._summarise_quarters = register("summarise_quarters")

    def for_partition(self, keys: KeySchema) -> RedisScripts:
        """Return these scripts over another partition's keys, sharing this object's transport."""
        other = copy.copy(self)
        other.keys = keys
        return other

    def connection_for(self, key: str):
        """Return this thread's connection that a script over `key` runs on (a follow-up such as WAIT goes there too)."""
        return self.transport.connection_for(key)

    def server_name(self) -> str:
        """Name the server these scripts' keys live on: calls that share it fail together."""
        return self.transport.server_name(self.keys.prefix)

    def _run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return self.transport.run(script, keys, args)

    def _run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        return self.transport.run_durably(script, keys, args, wait_s)

    def segment_keys(self, queue_name: str) -> list[str]:
        """Return the six segment keys of a queue in the scripts' order."""
        return [self.keys.segment(queue_name, segment) for segment in _SEGMENT_ORDER]

    @translate_errors
    def enqueue(
        self,
        task_id: str,
        payload: str,
        queue_name: str,
        segment: Segment,
        ready_score: str,
        score: str,
        minute: int,
        durable_within_s: float | None = None,
    ) -> int:
        return self.enqueue_many(
            queue_name, [(task_id, payload, segment, ready_score, score)], minute, durable_within_s
        ).stored

    @translate_errors
    def enqueue_many(
        self,
        queue_name: str,
        entries: Sequence[tuple[str, str, Segment, str, str]],
        minute: int,
        durable_within_s: float | None = None,
        schedule: tuple[str, str, str, str] = ("", "", "", "0"),
        unique: Sequence[UniqueSpec | None] = (),
        task_limit: tuple[str, str] = ("", ""),
        retried: bool = False,
    ) -> EnqueueReply:
        """Store (task id, payload, segment, ready score, score) entries of one queue in one call.

        `schedule` is (name, tick or "" for run-now, cron and zone, "1" on a broker's first offer) for a
        scheduled run: nothing is stored when its guard refused it. `unique` gives each entry's
        uniqueness (None: not unique); a duplicate is not stored, and the reply names its holder.
        `task_limit` is (task path, `limits.encode` of its limit) for a task with a per-task limit.
        `retried` says a first attempt whose reply was lost may have stored some: those are skipped.

        With `durable_within_s`, return only once they are in the append-only file; raises
        DurableEnqueueError when the server cannot confirm that within the time.
        """
        keys, args = self.enqueue_call(queue_name, entries, minute, schedule, unique, task_limit, retried)
        if durable_within_s is None:
            return EnqueueReply.read(self._run(self._enqueue, keys=keys, args=args))
        stored, synced = self._run_durably(self._enqueue, keys=keys, args=args, wait_s=durable_within_s)
        if int(synced[0]) < 1:
            ids = ", ".join(entry[0] for entry in entries)
            raise DurableEnqueueError(
                f"Task {ids} was enqueued, but the server did not confirm it in its append-only file "
                f"within {durable_within_s:g} s (fsync_enqueue): it may be lost if the server crashes now."
            )
        return EnqueueReply.read(stored)

    def enqueue_call(
        self,
        queue_name: str,
        entries: Sequence[tuple[str, str, Segment, str, str]],
        minute: int,
        schedule: tuple[str, str, str, str] = ("", "", "", "0"),
        unique: Sequence[UniqueSpec | None] = (),
        task_limit: tuple[str, str] = ("", ""),
        retried: bool = False,
    ) -> tuple[list[str], list[Any]]:
        """Return the keys and arguments of an enqueue script call (the asyncio path sends the same)."""
        k = self.keys
        keys = [
            k.queues(),
            k.throughput(queue_name, "ingress", minute),
            k.wake(queue_name),
            k.schedules(),
            k.totals(queue_name),
        ]
        args: list[Any] = [queue_name, k.telemetry(), THROUGHPUT_COUNTER_TTL_S, *schedule, self.sharded_flag]
        for task_id, payload, segment, ready_score, score in entries:
            keys += [k.task(task_id), k.segment(queue_name, segment)]
            args += [task_id, payload, segment.value, ready_score, score]
        held = [(i, spec) for i, spec in enumerate(unique, 1) if spec is not None] if unique else ()
        for i, spec in held:
            keys.append(k.unique(spec.digest))
            args += [i, spec.hold_ms, spec.segments]
        if task_limit[0]:
            keys += [k.task_limits(), k.limited_queues()]
        args += ["1" if retried else "0", *task_limit, len(held)]
        return keys, args

    @property
    def enqueue_script(self) -> LuaScript:
        return self._enqueue

    @translate_errors
    def acquire(
        self,
        queue_names: Sequence[str],
        count: int,
        worker: str,
        lease_ttl: float,
        token_base: str,
        limits: Sequence[str] = (),
        partitions: int = 1,
    ) -> list:
        """Lease up to `count` tasks; `limits` is each queue's setting as `limits.encode` writes it (none: "||")."""
        k = self.keys
        keys = [k.segment(q, Segment.READY) for q in queue_names]
        keys += [k.segment(q, Segment.RUNNING) for q in queue_names]
        keys.append(k.task_prefix())
        keys += [k.wake(q) for q in queue_names]
        keys += [k.paused(), k.limits(), k.throttled()]
        keys += [k.lease_times(q) for q in queue_names]
        keys += [k.limited_queues(), k.task_limits(), k.task_limit_prefix()]
        args = [len(queue_names), count, worker, lease_ttl, token_base, *queue_names]
        args += [*(limits or ["||"] * len(queue_names)), k.partition, partitions, TASK_LIMIT_LOOK]
        return self._run(self._acquire, keys=keys, args=args)

    @translate_errors
    def acknowledge(self, entries: Sequence[tuple], result_ttl: float, minute: int) -> list:
        """Acknowledge (task id, queue, lease token, document, finished segment[, end[, record[, unique]]]) entries.

        Returns 1 or 0 for each. `end` is `ENDED_BY_TIME_LIMIT` or `ENDED_BY_ABORT` for a run one
        of them ended, counted in the queue's totals. `record` is the attempt's record
        (`threadmill.attempts`), "" for none. `unique` True asks the script to release the task's
        uniqueness key. The optional letters and records go only when one of them is there.
        """
        k = self.keys
        queues = list(dict.fromkeys(entry[1] for entry in entries))
        index = {name: j for j, name in enumerate(queues, 1)}
        keys: list[str] = []
        for name in queues:
            keys += [k.throughput(name, "egress", minute), k.throughput(name, "failed", minute), k.totals(name)]
        args: list[Any] = [
            int(result_ttl), THROUGHPUT_COUNTER_TTL_S, k.telemetry(), self.sharded_flag, len(queues), *queues
        ]  # fmt: skip
        marks = uniques = ""
        records: list[str] = []
        # Each queue's segment keys built once a call, not twice a task.
        segment_keys = {(name, s): k.segment(name, s) for name in queues for s in (Segment.SUCCESSFUL, Segment.FAILED)}
        running = {name: k.segment(name, Segment.RUNNING) for name in queues}
        task_prefix = k.task("")
        for task_id, queue_name, token, document, segment, *more in entries:
            keys += [task_prefix + task_id, running[queue_name], segment_keys[queue_name, segment]]
            args += [task_id, token, document, segment._value_, index[queue_name]]  # `.value` is a property call
            marks += more[0] if more else "-"
            records.append(more[1] if len(more) > 1 else "")
            uniques += "u" if len(more) > 2 and more[2] else "-"
        if any(records) or "u" in uniques:
            args += [marks, uniques, *records]
        elif marks.strip("-"):
            args.append(marks)
        keys += [k.throttled(), *(k.wake(name) for name in queues)]
        return self._run(self._acknowledge, keys=keys, args=args)

    @translate_errors
    def requeue(
        self,
        task_id: str,
        queue_name: str,
        *,
        run_after: float | None,
        token: str = "",
        document: str = "",
        segment: str = "",
        counted: str = "",
        record: str = "",
    ) -> int:
        """Requeue one task, fenced by its lease `token` and by the `segment` it was read in ("" for none).

        `counted` names a field of the queue's totals to add 1 to once requeued ("" for none);
        `record` is the record of the attempt that ends here (`threadmill.attempts`), "" for none.
        """
        k = self.keys
        target = "ready" if run_after is None else "deferred"
        keys = [k.task(task_id), k.result(task_id), *self.segment_keys(queue_name), k.wake(queue_name)]
        keys += [k.totals(queue_name), k.throttled()]
        at = "" if run_after is None else repr(run_after)
        args = [task_id, target, at, token, document, segment, counted, record, queue_name]
        return self._run(self._requeue, keys=keys, args=args)

    @translate_errors
    def quarantine(
        self,
        task_id: str,
        queue_name: str,
        segment: Segment,
        error: str,
        token: str = "",
        result_ttl: float = DEFAULT_RESULT_TTL_S,
    ) -> int:
        """Move a task to the unreadable segment; 1 moved, 2 moved with its workflow children's settling cut short."""
        k = self.keys
        return self._run(
            self._quarantine,
            keys=[k.task(task_id), k.segment(queue_name, segment), k.segment(queue_name, Segment.UNREADABLE)],
            args=[task_id, error, token, int(result_ttl)],
        )

    @translate_errors
    def heartbeat(self, worker: str, document: str, document_ttl_s: float, publish: bool) -> bytes:
        """Record a worker's heartbeat (or, with an empty document, its goodbye); return the server's time."""
        k = self.keys
        return self._run(
            self._heartbeat,
            keys=[k.workers(), k.worker(worker)],
            args=[worker, document, document_ttl_s, k.telemetry() if publish and document else "", self.sharded_flag],
        )

    @translate_errors
    def release(self, leases: Sequence[tuple[str, str, str]]) -> int:
        """Hand (task id, queue, lease token) leases that never started back to ready; return how many."""
        k = self.keys
        keys = [k.task_prefix()]
        args: list[str] = []
        for task_id, queue_name, token in leases:
            keys += [k.segment(queue_name, Segment.RUNNING), k.segment(queue_name, Segment.READY), k.wake(queue_name)]
            args += [task_id, token]
        return self._run(self._release, keys=keys, args=args)

    @translate_errors
    def record_progress(self, task_id: str, token: str, stage: str) -> int:
        """Record that a suspect's run under lease `token` has "started" or "finished"; 0 when the fence refused it."""
        return self._run(self._record_progress, keys=[self.keys.task(task_id)], args=[token, stage])

    @translate_errors
    def extend_lease(self, task_id: str, queue_name: str, token: str, cover_s: float) -> bytes | None:
        """Make lease `token` last at least `cover_s` from now; return its deadline, None when the fence refused it."""
        keys = [self.keys.task(task_id), self.keys.segment(queue_name, Segment.RUNNING)]
        return self._run(self._extend_lease, keys=keys, args=[task_id, token, cover_s])

    @translate_errors
    def report(self, entries: Sequence[tuple[str, str, str, str, bool]]) -> list:
        """Store (task id, lease token, progress, metadata, merged) reports, each fenced by its token.

        Returns a reply per entry: 1 stored, 0 refused, or the stored metadata to merge first.
        """
        keys = [self.keys.task(task_id) for task_id, *_ in entries]
        args = []
        for _, token, progress, metadata, merged in entries:
            args += [token, progress, metadata, "1" if merged else "0"]
        args += [self.keys.telemetry(), self.sharded_flag]
        return self._run(self._report, keys=keys, args=args)

    @translate_errors
    def record_task_stats(self, counts: Mapping[str, Mapping[str, Mapping[str, int]]], minute: int) -> int:
        """Add per-task-path counts, {queue: {path: {name: increment}}}, to this minute's, hour's and total hashes."""
        k = self.keys
        keys: list[str] = []
        args: list[Any] = [taskstats.HISTORY_TTL_S, taskstats.PATH_CAP, taskstats.OTHER_PATH]
        for queue_name, paths in counts.items():
            keys += [
                k.task_stats(queue_name, f"m{minute}"), k.task_stats(queue_name, f"h{minute // 60}"),
                k.task_stats(queue_name, "total"), k.task_paths(queue_name),
            ]  # fmt: skip
            args.append(len(paths))
            for path, named in paths.items():
                args += [path, len(named)]
                for name, by in named.items():
                    args += [name, by]
        return self._run(self._record_task_stats, keys=keys, args=args)

    @translate_errors
    def aborts_requested(self, leases: Sequence[tuple[str, str]]) -> list:
        """Return, per (task id, lease token), the abort request stored for that lease, or None."""
        keys = [self.keys.task(task_id) for task_id, _ in leases]
        return self._run(self._aborts_requested, keys=keys, args=[token for _, token in leases])

    @translate_errors
    def release_unanswered(self, queue_names: Sequence[str], token_bases: Sequence[str], scan_limit: int) -> int:
        """Hand back leases taken by acquire calls (by token base) whose reply was lost; return how many."""
        k = self.keys
        keys = [k.task_prefix()]
        for queue_name in queue_names:
            keys += [k.segment(queue_name, Segment.RUNNING), k.segment(queue_name, Segment.READY), k.wake(queue_name)]
        return self._run(self._release_unanswered, keys=keys, args=[scan_limit, *token_bases])

    @translate_errors
    def wait_for_wake(self, wake_keys: Sequence[str], timeout_s: float, socket_timeout_s: float) -> str | None:
        """Block until a token arrives on one of `wake_keys` (BLPOP) or `timeout_s` passes; return its key or None."""
        return self.transport.wait_for_wake(wake_keys, timeout_s, socket_timeout_s)

    @translate_errors
    def pass_wake(self, queue_names: Sequence[str]) -> int:
        """Push a wake token onto the first unpaused queue with ready tasks and no token; 1 if one was pushed."""
        k = self.keys
        keys = [k.segment(q, Segment.READY) for q in queue_names] + [k.wake(q) for q in queue_names]
        return self._run(self._pass_wake, keys=[*keys, k.paused()], args=list(queue_names))
