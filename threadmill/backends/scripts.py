"""One named Python wrapper for each Lua script; each call is one atomic operation.

The wrappers take key names already built by `KeySchema` and return the script's
reply as it comes (bytes). Driver errors become `BackendConnectionError` here.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import os
import re
import select
import threading
from collections.abc import Iterator, Mapping, Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

from ..exceptions import BackendConnectionError, DurableEnqueueError, ServerUnreachable
from . import taskstats
from .base import Segment
from .keys import PRIORITY_BAND, THROUGHPUT_COUNTER_TTL_S, KeySchema
from .limits import TASK_LIMIT_LOOK

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


#: Driver errors that mean the server (or the cluster's node for a key) cannot be reached now, not a
#: refusal: a lost connection, a timeout, and on a cluster a slot without a live primary or a
#: redirection still wrong after a refresh of the slot map (a failover in progress).
UNREACHABLE_ERRORS = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
    redis.exceptions.TryAgainError,
    redis.exceptions.AskError,
)


#: Letters of acknowledge.lua's optional argument: a run its time limit ended, or an abort.
ENDED_BY_TIME_LIMIT = "t"
ENDED_BY_ABORT = "a"

#: A line of a script that stands for a file of `lua/lib/` (shared local functions), as `-- include: keyset`.
_INCLUDE = re.compile(r"^-- include: (\w+)$", re.MULTILINE)


def expand_includes(text: str) -> str:
    """Return Lua `text` with each `-- include: <lib>` line replaced by `lua/lib/<lib>.lua` (not recursive)."""
    lib = files("threadmill.backends").joinpath("lua", "lib")
    return _INCLUDE.sub(lambda m: lib.joinpath(f"{m.group(1)}.lua").read_text(), text)


def _source(name: str) -> str:
    """Return a script's source, its includes expanded."""
    return expand_includes(files("threadmill.backends").joinpath("lua", f"{name}.lua").read_text())


def translate_errors(method):
    """Re-raise redis-py's errors: connection losses and timeouts as ServerUnreachable, the rest as BackendConnectionError."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except UNREACHABLE_ERRORS as e:
            raise ServerUnreachable(f"Cannot reach the Redis server: {e}") from e
        except redis.ResponseError as e:
            raise BackendConnectionError(f"The Redis server refused a Threadmill script: {e}") from e

    return wrapper


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """The same translation as `translate_errors`, for a block (the asyncio client's calls)."""
    try:
        yield
    except UNREACHABLE_ERRORS as e:
        raise ServerUnreachable(f"Cannot reach the Redis server: {e}") from e
    except redis.ResponseError as e:
        raise BackendConnectionError(f"The Redis server refused a Threadmill script: {e}") from e


def _durable_enqueue_error(error: redis.ResponseError) -> DurableEnqueueError:
    """Explain a WAITAOF refusal: no append-only file, or a server too old to have WAITAOF."""
    text = str(error)
    if "appendonly is disabled" in text:
        reason = (
            "the Redis server has no append-only file (appendonly no), so it cannot confirm a task is on disk. "
            "Turn it on (appendonly yes in its configuration, or CONFIG SET appendonly yes)"
        )
    elif "unknown command" in text.lower():
        reason = "the Redis server does not know WAITAOF, which needs Redis or Valkey 7.2 or later. Upgrade the server"
    else:
        reason = f"the Redis server refused WAITAOF ({text}). Fix the server"
    return DurableEnqueueError(f"The backend option fsync_enqueue is on, but {reason}, or turn fsync_enqueue off.")


def reusable(connection: redis.Connection) -> redis.Connection:
    """Return a kept connection fit to send on: one the server closed (a restart, CLIENT KILL) is dropped first.

    The check redis-py's pool makes when it hands out a connection, which ours (kept per
    thread) never pass through. An idle request/response connection whose socket polls
    readable holds the server's FIN or RST, or a reply nobody read: nothing to keep, and
    `send_command` connects anew. A poll, no round trip: measured 0.4 us a call, against
    1.5 us for redis-py's `connect()` and `can_read()` and 15 us for the call itself.
    """
    sock = getattr(connection, "_sock", None)  # None: not connected, send_command connects
    if sock is not None and polls_readable(sock):
        connection.disconnect()
    return connection


def polls_readable(sock: Any) -> bool:
    """Whether a socket (anything with `fileno()`) has something to read now, its peer's close included."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)  # POLLHUP and POLLERR are reported whatever the mask
    return bool(poller.poll(0))


def _heartbeats(ages: Mapping[str, float] | None, settle_s: float | None = None) -> str:
    """Encode heartbeat ages for a script: "" to read the workers set itself, else "+" and `name<TAB>age` lines.

    With `settle_s` a script that reads the set itself ("@" and the seconds) counts no worker with a
    heartbeat as silent until its server has been up that long.
    """
    if ages is None:
        return "" if settle_s is None else f"@{settle_s:.3f}"
    return "+" + "".join(f"{name}\t{age:.3f}\n" for name, age in ages.items())


class EnqueueReply(NamedTuple):
    """What the enqueue script answered: how many tasks it stored, and the holder of each duplicate's key."""

    stored: int
    #: Index of an entry in the call (from 0) -> the id of the task that holds its uniqueness key.
    holders: dict[int, str]

    def without_own(self, prepared: Sequence[Any]) -> EnqueueReply:
        """Drop the entries whose key holder is the entry itself: stored by a retried call's first attempt."""
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


class LuaScript:
    """A script's source and its SHA1, the name EVALSHA calls it by."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class RedisScripts:
    """The backend's Lua scripts, called over one connection per thread.

    Each call goes straight to a connection taken from the client's pool (kept per
    thread and per process), not through redis-py's command layer: measured, that
    layer cost about 57 us of CPU per call against 15 us for sending and reading
    directly, and the worker makes one or two calls per batch of tasks.
    """

    def __init__(self, client: redis.Redis, keys: KeySchema, *, sharded_telemetry: bool = False) -> None:
        self.keys = keys
        self.client = client
        #: The scripts' publish flag: "1" publishes telemetry with SPUBLISH (a cluster's sharded pub/sub).
        self.sharded_flag = "1" if sharded_telemetry else "0"
        self._local = threading.local()
        register = LuaScript
        self._enqueue = register(_source("enqueue"))
        self._acquire = register(_source("acquire"))
        self._acknowledge = register(_source("acknowledge"))
        self._requeue = register(_source("requeue"))
        self._quarantine = register(_source("quarantine"))
        self._promote = register(_source("promote"))
        self._claim_expired = register(_source("claim_expired"))
        self._purge = register(_source("purge"))
        self._delete = register(_source("delete"))
        self._peek = register(_source("peek"))
        self._peek_matching = register(_source("peek_matching"))
        self._peek_after = register(_source("peek_after"))
        self._requeue_many = register(_source("requeue_many"))
        self._heartbeat = register(_source("heartbeat"))
        self._pause = register(_source("pause"))
        self._take_control = register(_source("take_control"))
        self._sample_latency = register(_source("sample_latency"))
        self._resume = register(_source("resume"))
        self._claim_abandoned = register(_source("claim_abandoned"))
        self._release = register(_source("release"))
        self._release_unanswered = register(_source("release_unanswered"))
        self._record_progress = register(_source("record_progress"))
        self._extend_lease = register(_source("extend_lease"))
        self._report = register(_source("report"))
        self._cancel = register(_source("cancel"))
        self._aborts_requested = register(_source("aborts_requested"))
        self._trim_finished = register(_source("trim_finished"))
        self._live_leases = register(_source("live_leases"))
        self._scan = register(_source("scan"))
        self._pass_wake = register(_source("pass_wake"))
        self._record_task_stats = register(_source("record_task_stats"))
        self._limit = register(_source("limit"))
        self._limit_state = register(_source("limit_state"))

    def for_partition(self, keys: KeySchema) -> RedisScripts:
        """Return these scripts over another partition's keys, sharing this object's connections."""
        other = copy.copy(self)
        other.keys = keys
        return other

    def connection_for(self, key: str):
        """Return this thread's connection that a script over `key` runs on (a follow-up such as WAIT goes there too)."""
        return self._connection()

    def server_name(self) -> str:
        """Name the server these scripts' keys live on: calls that share it fail together."""
        return ""

    def _connection(self):
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.connection = self.client.connection_pool.make_connection()
            local.pid = os.getpid()
            local.aof_checked = False
        return local.connection

    def _run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        connection = self._connection()
        try:
            reusable(connection)
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return connection.read_response()
        except redis.exceptions.NoScriptError:
            connection.send_command("SCRIPT", "LOAD", script.source)
            connection.read_response()
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise

    def _run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        """Run a script, then WAITAOF for its writes on the same connection; return both replies.

        WAITAOF waits for the writes of its own connection, hence the same one. It is a second
        round trip, not pipelined with the script: pipelined, the server blocks WAITAOF before
        the write reaches the file and wakes it only at its next cron tick (measured 108 ms an
        enqueue at appendfsync everysec, against 0.1 ms for two round trips).
        """
        connection = self._connection()
        wait_ms = max(1, round(wait_s * 1000))
        if not self._local.aof_checked:
            # Once per connection, before its first durable write, so a server without an
            # append-only file refuses before any task is stored. WAITAOF on a connection that
            # has written nothing returns at once; unlike CONFIG GET it is never disabled.
            self._wait_for_append_only_file(reusable(connection), wait_ms)
            self._local.aof_checked = True
        reply = self._run(script, keys, args)
        return reply, self._wait_for_append_only_file(connection, wait_ms)

    def _wait_for_append_only_file(self, connection, wait_ms: int) -> list:
        try:
            connection.send_command("WAITAOF", 1, 0, wait_ms)
            return connection.read_response()
        except redis.ResponseError as e:
            raise _durable_enqueue_error(e) from e
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise

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
    ) -> EnqueueReply:
        """Store (task id, payload, segment, ready score, score) entries of one queue in one call.

        `schedule` is (name, tick or "" for run-now, cron and zone, "1" on a broker's first offer) for a
        scheduled run: nothing is stored when its guard refused it. `unique` gives each entry's
        uniqueness (None: not unique); a duplicate is not stored, and the reply names its holder.
        `task_limit` is (task path, `limits.encode` of its limit) for a task with a per-task limit.

        With `durable_within_s`, return only once they are in the append-only file; raises
        DurableEnqueueError when the server cannot confirm that within the time.
        """
        keys, args = self.enqueue_call(queue_name, entries, minute, schedule, unique, task_limit)
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
        held = [(i, spec) for i, spec in enumerate(unique, 1) if spec is not None]
        for i, spec in held:
            keys.append(k.unique(spec.digest))
            args += [i, spec.hold_ms, spec.segments]
        keys += [k.task_limits(), k.limited_queues()]
        args += [*task_limit, len(held)]
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
        for task_id, queue_name, token, document, segment, *more in entries:
            keys += [k.task(task_id), k.segment(queue_name, Segment.RUNNING), k.segment(queue_name, segment)]
            args += [task_id, token, document, segment.value, index[queue_name]]
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
    def quarantine(self, task_id: str, queue_name: str, segment: Segment, error: str, token: str = "") -> int:
        k = self.keys
        return self._run(
            self._quarantine,
            keys=[k.task(task_id), k.segment(queue_name, segment), k.segment(queue_name, Segment.UNREADABLE)],
            args=[task_id, error, token],
        )

    @translate_errors
    def promote(self, queue_name: str, batch_size: int) -> tuple[int, float | None]:
        """Promote due deferred tasks; return (how many, seconds until the next is due or None)."""
        k = self.keys
        moved, wait = self._run(
            self._promote,
            keys=[
                k.segment(queue_name, Segment.DEFERRED),
                k.segment(queue_name, Segment.READY),
                k.task_prefix(),
                k.wake(queue_name),
            ],
            args=[batch_size],
        )
        wait = float(wait)
        return int(moved), None if wait < 0 else wait

    @translate_errors
    def claim_expired(self, queue_name: str, batch_size: int, claim_window_s: float, token_base: str) -> list:
        k = self.keys
        return self._run(
            self._claim_expired,
            keys=[k.segment(queue_name, Segment.RUNNING), k.task_prefix()],
            args=[batch_size, claim_window_s, token_base],
        )

    @translate_errors
    def trim_finished(self, queue_name: str, result_ttl: float, limit: int) -> int:
        """Drop up to `limit` ids from each finished segment of a queue finished over `result_ttl` ago."""
        k = self.keys
        return self._run(
            self._trim_finished,
            keys=[k.segment(queue_name, Segment.SUCCESSFUL), k.segment(queue_name, Segment.FAILED)],
            args=[result_ttl, limit],
        )

    @translate_errors
    def purge(self, queue_name: str, segment: Segment, batch_size: int) -> int:
        k = self.keys
        return self._run(
            self._purge,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[batch_size, segment.value],
        )

    @translate_errors
    def delete(self, queue_name: str, segment: Segment, task_ids: Sequence[str]) -> list[str]:
        """Delete those of the given tasks still in one segment of a queue; return the ids deleted."""
        k = self.keys
        reply = self._run(
            self._delete,
            keys=[k.task_prefix(), k.result_prefix(), k.segment(queue_name, segment)],
            args=[queue_name, segment.value, *task_ids],
        )
        return [task_id.decode() for task_id in reply]

    @translate_errors
    def peek(self, queue_name: str, segment: Segment, offset: int, count: int, newest_first: bool) -> list:
        k = self.keys
        return self._run(
            self._peek,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[offset, count, "1" if newest_first else "0"],
        )

    @translate_errors
    def peek_after(
        self, queue_name: str, segment: Segment, cursor: tuple[str, str] | None, count: int, newest_first: bool
    ) -> list:
        """Return the segment's total and the rows of its first `count` entries past `cursor` (None: the head)."""
        k = self.keys
        score, task_id = cursor or ("", "")
        return self._run(
            self._peek_after,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[score, task_id, count, "1" if newest_first else "0"],
        )

    @translate_errors
    def peek_matching(
        self,
        queue_name: str,
        segment: Segment,
        offset: int,
        count: int,
        newest_first: bool,
        scan_limit: int,
        needles: Sequence[str],
    ) -> list:
        k = self.keys
        return self._run(
            self._peek_matching,
            keys=[k.segment(queue_name, segment), k.task_prefix(), k.result_prefix()],
            args=[offset, count, "1" if newest_first else "0", scan_limit, *needles],
        )

    @translate_errors
    def requeue_many(
        self,
        queue_name: str,
        segment: Segment,
        entries: Sequence[tuple[str, str, str]],
        needles: Sequence[str],
        force: bool,
        worker_timeout: float,
        heartbeats: Mapping[str, float] | None = None,
        settle_s: float | None = None,
    ) -> tuple[list[str], list[str]]:
        """Requeue (task id, lease token, document) entries of one segment to ready; return (moved, refused).

        `heartbeats` None reads heartbeats from the workers set (partition 0), and with `settle_s`
        counts none as silent until the server has been up that long; a mapping gives every
        worker's heartbeat age, read from partition 0 (another partition's slot lacks the set).
        """
        k = self.keys
        given = _heartbeats(heartbeats, settle_s)
        args: list[Any] = [segment.value, "1" if force else "0", worker_timeout, given, len(needles), *needles]
        for entry in entries:
            args += entry
        reply = self._run(
            self._requeue_many,
            keys=[
                k.task_prefix(),
                k.result_prefix(),
                k.segment(queue_name, Segment.READY),
                k.segment(queue_name, segment),
                k.workers(),
                k.wake(queue_name),
            ],
            args=args,
        )
        ids = [task_id.decode() for task_id in reply[1:]]
        return ids[: reply[0]], ids[reply[0] :]

    @translate_errors
    def live_leases(
        self,
        queue_name: str,
        task_ids: Sequence[str],
        worker_timeout: float,
        heartbeats: Mapping[str, float] | None = None,
        settle_s: float | None = None,
    ) -> list[str]:
        """Return those of the ids running under a live lease (deadline ahead, worker not silent); see requeue_many."""
        k = self.keys
        reply = self._run(
            self._live_leases,
            keys=[k.segment(queue_name, Segment.RUNNING), k.task_prefix(), k.workers()],
            args=[worker_timeout, _heartbeats(heartbeats, settle_s), *task_ids],
        )
        return [task_id.decode() for task_id in reply]

    @translate_errors
    def scan(
        self, queue_name: str, segment: Segment, cursor: tuple[bytes, bytes], count: int, newest_first: bool
    ) -> list[tuple[bytes, bytes]]:
        """Return the next (id, score) entries of a segment after a (score, id) cursor; (b"", b"") starts."""
        reply = self._run(
            self._scan,
            keys=[self.keys.segment(queue_name, segment)],
            args=[cursor[0], cursor[1], count, "1" if newest_first else "0"],
        )
        return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

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
    def claim_abandoned(
        self,
        queue_name: str,
        worker_timeout_s: float,
        forget_after_s: float,
        batch_size: int,
        scan_limit: int,
        claim_window_s: float,
        token_base: str,
        heartbeats: Mapping[str, float] | None = None,
        lease_ttl_s: float | None = None,
    ) -> list:
        """Claim the leases of dead workers; return the claimed rows.

        `heartbeats` (every worker's heartbeat age) is given for partitions above 0, whose slot
        lacks the workers set. With `lease_ttl_s`, a lease whose worker never sent a heartbeat is
        a dead worker's once it is `worker_timeout_s` old.
        """
        k = self.keys
        args: list[Any] = [worker_timeout_s, forget_after_s, batch_size, scan_limit, claim_window_s, token_base]
        args += [_heartbeats(heartbeats), "" if lease_ttl_s is None else lease_ttl_s]
        return self._run(
            self._claim_abandoned,
            keys=[k.workers(), k.segment(queue_name, Segment.RUNNING), k.task_prefix()],
            args=args,
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
    def cancel(
        self, task_id: str, queue_name: str, segment: str, document: str, result_ttl: float, request: str, minute: int
    ) -> int:
        """Cancel one task read in `segment`, or ask it to abort if it runs; the reply codes are cancel.lua's."""
        k = self.keys
        read = segment if segment in ("ready", "deferred") else "ready"
        keys = [
            k.task(task_id),
            k.segment(queue_name, read),
            k.segment(queue_name, Segment.FAILED),
            k.totals(queue_name),
            k.throughput(queue_name, "egress", minute),
            k.throughput(queue_name, "failed", minute),
        ]
        args = [task_id, segment, document, int(result_ttl), request, THROUGHPUT_COUNTER_TTL_S]
        return self._run(self._cancel, keys=keys, args=args)

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
        connection = self._connection()
        try:
            reusable(connection)
            connection.send_command("BLPOP", *wake_keys, timeout_s)
            reply = connection.read_response(timeout=timeout_s + socket_timeout_s)
            return None if reply is None else reply[0].decode()
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            raise

    @translate_errors
    def pass_wake(self, queue_names: Sequence[str]) -> int:
        """Push a wake token onto the first unpaused queue with ready tasks and no token; 1 if one was pushed."""
        k = self.keys
        keys = [k.segment(q, Segment.READY) for q in queue_names] + [k.wake(q) for q in queue_names]
        return self._run(self._pass_wake, keys=[*keys, k.paused()], args=list(queue_names))

    @translate_errors
    def pause(self, queue_name: str, by: str) -> int:
        return self._run(self._pause, keys=[self.keys.paused()], args=[queue_name, by])

    @translate_errors
    def resume(self, queue_name: str) -> int:
        k = self.keys
        return self._run(
            self._resume, keys=[k.paused(), k.segment(queue_name, Segment.READY), k.wake(queue_name)], args=[queue_name]
        )

    @translate_errors
    def limit(self, queue_name: str, given: str | None, by: str) -> bytes | None:
        """Store the `given` parts of a queue's runtime limits ("c|n|period", empty parts kept), or clear them (None)."""
        k = self.keys
        keys = [k.limits(), k.segment(queue_name, Segment.READY), k.wake(queue_name)]
        args = [queue_name, "clear", "", by] if given is None else [queue_name, "set", given, by]
        return self._run(self._limit, keys=keys, args=args)

    @translate_errors
    def limit_state(self, queue_names: Sequence[str], rate_counts: Sequence[int | None], partitions: int) -> list:
        """Read each queue's runtime limits, ready and running counts and the lease time its next rate token waits on.

        `rate_counts` are the settings' rate counts (None: no rate); see limit_state.lua for the reply.
        """
        k = self.keys
        keys = [k.limits()]
        args: list[Any] = [k.partition, partitions]
        for name, count in zip(queue_names, rate_counts, strict=True):
            keys += [k.segment(name, Segment.READY), k.segment(name, Segment.RUNNING), k.lease_times(name)]
            args += [name, "" if count is None else count]
        return self._run(self._limit_state, keys=keys, args=args)

    @translate_errors
    def take_control(self, workers: Sequence[str]) -> list:
        return self._run(self._take_control, keys=[self.keys.control()], args=list(workers))

    @translate_errors
    def sample_latency(self, queue_name: str) -> int:
        k = self.keys
        return self._run(
            self._sample_latency,
            keys=[k.segment(queue_name, Segment.READY), k.throughput_prefix(queue_name, "latency")],
            args=[THROUGHPUT_COUNTER_TTL_S, PRIORITY_BAND],
        )
