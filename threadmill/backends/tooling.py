"""Reading and managing a queue's segments: the backend's half of the tooling API.

`RedisTooling` is mixed into `RedisTaskBackend`; the console reaches it only through
`threadmill.api`. Reads take one round trip a page, whatever a segment's depth; every
write is one Lua script.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.tasks import TaskResult
from django.tasks.exceptions import TaskResultDoesNotExist

from ..outcome import record_abandoned
from . import codec
from .base import (
    UNREADABLE_PAYLOAD_ERRORS,
    HeartbeatReading,
    Page,
    PausedQueue,
    Segment,
    ThreadmillTaskResult,
    UnreadableTask,
)
from .keys import PRIORITY_BAND, TASK_FIELDS
from .merge import Cursor, KeysetPage, merge_rows
from .partitions import by_partition
from .scripts import translate_errors

if TYPE_CHECKING:
    import redis

    from ..schedules import Schedule
    from .keys import KeySchema
    from .options import BackendOptions
    from .scripts import RedisScripts

logger = logging.getLogger("threadmill.backend")

#: Longest history a queue keeps, minutes (its per-minute counters live 25 hours).
HISTORY_MINUTES = 24 * 60
#: What an operator can ask of a worker process: stop fetching but stay alive, or stop.
WORKER_COMMANDS = ("quiet", "stop")
#: Segments listed newest first; the others are listed in the order they are taken.
NEWEST_FIRST = frozenset({Segment.SUCCESSFUL, Segment.FAILED, Segment.UNREADABLE})
_FINISHED = frozenset({Segment.SUCCESSFUL, Segment.FAILED})
#: Times a requeue of running tasks reads them again when the fence refused them (leased again since).
REQUEUE_ROUNDS = 3
#: Times `delete(task_ids)` reads again where a task is, when it moved while being deleted.
DELETE_ROUNDS = 3


def _epoch(value: bytes | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


def _with_run_after(items: list, run_at: list[datetime | None]) -> list:
    """Give each readable deferred task the time it runs (its score), which a retry's backoff sets."""
    return [
        item if isinstance(item, UnreadableTask) else replace(item, task=item.task.using(run_after=at))
        for item, at in zip(items, run_at, strict=True)
    ]


class RedisTooling:
    """Paging, counting, requeueing in bulk, deleting and purging the segments of queues."""

    keys: KeySchema
    config: BackendOptions
    schedules: tuple[Schedule, ...]
    queues: set[str]
    client: redis.Redis
    cluster: bool
    scripts: RedisScripts
    # From PartitionRouting (mixed in beside this class).
    keys_for: Any
    scripts_for: Any
    task_keys: Any
    task_scripts: Any
    covered_partitions: Any

    def _partition_scripts(self) -> list[RedisScripts]:
        """The scripts of every covered partition, partition 0 first."""
        return [self.scripts_for(partition) for partition in self.covered_partitions()]

    def client_for(self, key: str) -> redis.Redis:
        """Return a plain client on the node holding `key`: the one server, or the primary owning its slot.

        For commands a cluster client will not route by key, such as TIME in a pipeline: every
        decision about leases and heartbeats uses the clock of the node that holds them.
        """
        if not self.cluster:
            return self.client
        return self.client.get_redis_connection(self.client.get_node_from_key(key))

    def quarantine_unreadable(
        self, task_id: str, queue_name: str, segment: Segment, error: Exception, token: str, path: str
    ) -> None:
        """Move a task whose payload this code cannot read to the unreadable segment, and log it once.

        Fenced by `token` and by `segment`: a task that left the segment it was read in is left to
        the path that has it now (a worker that acquired it quarantines it under its lease).
        """
        text = f"{type(error).__name__}: {error}"
        if self.task_scripts(task_id).quarantine(task_id, queue_name, segment, text, token) == 1:
            logger.error(
                "Task %s on queue %s is unreadable (%s path) and was quarantined: %s", task_id, queue_name, path, text
            )

    def purge(self, queue_name: str, *, segment: Segment | str) -> int:
        """Delete a segment and the task data it owns, in batches; return how many were removed."""
        segment = Segment.parse(segment)
        removed = 0
        for scripts in self._partition_scripts():
            while batch := scripts.purge(queue_name, segment, self.config.batch_size):
                removed += batch
        return removed

    def delete_many(self, queue_name: str, *, segment: Segment | str, task_ids: Iterable[str]) -> list[str]:
        """Delete those of the given tasks still in one segment of a queue, in one script; return their ids.

        A task that moved elsewhere since the caller saw it is left alone.
        """
        segment = Segment.parse(segment)
        deleted: list[str] = []
        for partition, ids in by_partition(task_ids, str).items():
            deleted += self.scripts_for(partition).delete(queue_name, segment, ids)
        return deleted

    def delete(self, task_ids: Iterable[str]) -> int:
        """Remove the given tasks wherever they are, with their data and results; return how many existed."""
        pending, deleted = list(task_ids), 0
        # Each task is deleted only from the segment it was just read in; one that moved in
        # between is read again (a task can move only so often: a few rounds settle it).
        for _ in range(DELETE_ROUNDS):
            if not pending:
                break
            places: dict[tuple[str, Segment], list[str]] = {}
            for task_id, (queue_name, segment) in zip(pending, self._places(pending), strict=True):
                if queue_name is not None:
                    places.setdefault((queue_name.decode(), Segment(segment.decode())), []).append(task_id)
            gone: set[str] = set()
            for (queue_name, segment), ids in places.items():
                for partition, group in by_partition(ids, str).items():
                    gone.update(self.scripts_for(partition).delete(queue_name, segment, group))
            deleted += len(gone)
            pending = [task_id for ids in places.values() for task_id in ids if task_id not in gone]
        return deleted

    @translate_errors
    def _places(self, task_ids: Sequence[str]) -> list[list]:
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.task_keys(task_id).task(task_id), ("queue", "segment"))
        return pipe.execute()

    def peek(self, queue_name: str, *, segment: Segment | str, offset: int = 0, count: int = 50) -> Page:
        """Return one page of a segment in queue order, with the segment's total, in one round trip a partition.

        With several partitions the page merges them in queue order; deep offsets read every
        partition's head up to the offset, so the console pages by cursor (`peek_page`) instead.
        """
        segment = Segment.parse(segment)
        if offset < 0 or count < 1:
            raise ValueError("peek needs offset >= 0 and count >= 1.")
        newest_first = segment in NEWEST_FIRST
        if len(self.covered_partitions()) == 1:
            reply = self.scripts.peek(queue_name, segment, offset, count, newest_first)
            items = [self._peeked(queue_name, segment, reply[i : i + 9]) for i in range(2, len(reply), 9)]
            return Page(items, int(reply[0]))
        replies = [s.peek(queue_name, segment, 0, offset + count, newest_first) for s in self._partition_scripts()]
        rows, _ = merge_rows([(reply, 2) for reply in replies], newest_first, offset + count)
        items = [self._peeked(queue_name, segment, row) for row in rows[offset:]]
        return Page(items, sum(int(reply[0]) for reply in replies))

    def peek_page(
        self,
        queue_name: str,
        *,
        segment: Segment | str,
        after: Cursor | None = None,
        before: Cursor | None = None,
        count: int = 50,
        newest_first: bool | None = None,
    ) -> KeysetPage:
        """Return the page of a segment after (or before) a cursor, merged over partitions in queue order.

        One script call per partition, whatever the depth: each returns its first `count`
        entries past the cursor. A cursor is the (score, id) of the last entry of the page
        before (`after`) or the first of the page after (`before`); neither starts at the head.
        """
        segment = Segment.parse(segment)
        if count < 1 or (after is not None and before is not None):
            raise ValueError("peek_page needs count >= 1 and at most one of after and before.")
        newest_first = segment in NEWEST_FIRST if newest_first is None else newest_first
        backward = before is not None
        cursor = before if backward else after
        walk = newest_first != backward
        # One more than a page from each, so "is there a next page" is known, not guessed.
        replies = [s.peek_after(queue_name, segment, cursor, count + 1, walk) for s in self._partition_scripts()]
        rows, more = merge_rows([(reply, 2) for reply in replies], walk, count)
        if backward:
            rows.reverse()
        items = [self._peeked(queue_name, segment, row) for row in rows]
        if segment is Segment.DEFERRED:
            items = _with_run_after(items, [codec.moment(row[8]) for row in rows])
        edges = [(row[8].decode(), row[0].decode()) for row in (rows[0], rows[-1])] if rows else []
        has_next = (more if not backward else True) and bool(rows)
        has_previous = (cursor is not None if not backward else more) and bool(rows)
        return KeysetPage(
            items,
            sum(int(reply[0]) for reply in replies),
            next_cursor=edges[1] if edges and has_next else None,
            previous_cursor=edges[0] if edges and has_previous else None,
        )

    def _peeked(self, queue_name: str, segment: Segment, row: list) -> TaskResult | UnreadableTask:
        task_id = row[0].decode()
        data, stored_result, started_at, worker, lease_started, token, read_error, score = row[1:]
        raw = stored_result or data or b""
        if segment is Segment.UNREADABLE:
            return UnreadableTask(task_id, queue_name, segment, raw, codec.text(read_error))
        try:
            return codec.decode(
                raw,
                segment,
                started_at=started_at or None,
                lease_worker=codec.text(worker),
                lease_started_at=codec.moment(lease_started),
                lease_token=codec.text(token),
                lease_deadline=codec.moment(score) if segment is Segment.RUNNING else None,
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            if segment not in _FINISHED:
                self.quarantine_unreadable(task_id, queue_name, segment, e, codec.text(token), "peek")
            return UnreadableTask(task_id, queue_name, segment, raw, f"{type(e).__name__}: {e}")

    @translate_errors
    def queue_names(self) -> list[str]:
        """Return every configured queue and every queue a task was enqueued on, sorted."""
        pipe = self.client.pipeline(transaction=False)
        for partition in self.covered_partitions():
            pipe.smembers(self.keys_for(partition).queues())
        stored = {q.decode() for members in pipe.execute() for q in members}
        return sorted(stored | set(self.queues))

    def pause(self, queue_name: str, *, by: str = "") -> bool:
        """Stop workers acquiring the queue's tasks (enqueues still land); False when it was paused already.

        Each partition has its own copy of the paused queues (acquire reads it in its slot).
        Partition 0 is written first and the partition count read after it, from the server: a
        process raising the count copies partition 0's pauses after raising it, so one of the
        two reaches each new partition.
        """
        paused = bool(self.scripts.pause(queue_name, by))
        for partition in self.covered_partitions(fresh=True)[1:]:
            paused = bool(self.scripts_for(partition).pause(queue_name, by)) or paused
        return paused

    def resume(self, queue_name: str) -> bool:
        """Let workers acquire the queue's tasks again, in every partition; False when no partition had it paused.

        Like `pause`, partition 0 first, then every partition below the count stored now (a
        cached count would miss the partitions a wider process copied the pause into).
        """
        resumed = bool(self.scripts.resume(queue_name))
        for partition in self.covered_partitions(fresh=True)[1:]:
            resumed = bool(self.scripts_for(partition).resume(queue_name)) or resumed
        return resumed

    @translate_errors
    def paused_queues(self) -> dict[str, PausedQueue]:
        """Return every paused queue with who paused it and since when.

        A queue paused in any partition is paused, since acquire skips it there: read over the
        partition count stored now, partition 0's record first.
        """
        pipe = self.client.pipeline(transaction=False)
        for partition in self.covered_partitions(fresh=True):
            pipe.hgetall(self.keys_for(partition).paused())
        paused: dict[str, PausedQueue] = {}
        for stored in pipe.execute():
            for name, raw in stored.items():
                if name.decode() not in paused:
                    document = json.loads(raw)
                    since = datetime.fromtimestamp(document["since"], UTC)
                    paused[name.decode()] = PausedQueue(str(document["by"]), since)
        return paused

    @translate_errors
    def worker_heartbeats(self) -> dict[str, float]:
        """Return every worker process that sent a heartbeat and not its goodbye: name -> last heartbeat, epoch s."""
        return {name.decode(): score for name, score in self.client.zrange(self.keys.workers(), 0, -1, withscores=True)}

    @translate_errors
    def schedule_states(self) -> dict[str, dict[str, Any]]:
        """Return each schedule's stored state: last tick and task, when it was enqueued, and who paused it."""
        raw = {field.decode(): value for field, value in self.client.hgetall(self.keys.schedules()).items()}
        states: dict[str, dict[str, Any]] = {}
        for schedule in self.schedules:
            name = schedule.name
            paused = raw.get(f"{name}:paused")
            states[name] = {
                "last_tick": _epoch(raw.get(f"{name}:tick")),
                "last_task": codec.text(raw.get(f"{name}:task")) or None,
                "last_enqueued_at": _epoch(raw.get(f"{name}:enqueued_at")),
                "paused": None if paused is None else json.loads(paused),
            }
        return states

    @translate_errors
    def pause_schedule(self, name: str, *, by: str = "") -> bool:
        """Stop enqueueing a schedule's runs (stored in Redis, not settings); False when it was paused already."""
        document = json.dumps({"by": by, "since": time.time()})
        return bool(self.client.hsetnx(self.keys.schedules(), f"{name}:paused", document))

    @translate_errors
    def resume_schedule(self, name: str) -> bool:
        """Enqueue a paused schedule's runs again, from its next tick; False when it was not paused."""
        return bool(self.client.hdel(self.keys.schedules(), f"{name}:paused"))

    @translate_errors
    def send_control(self, workers: Sequence[str], command: str, *, by: str = "") -> None:
        """Ask the supervisors of `workers` to make them quiet or stop; the command waits in Redis until taken."""
        if command not in WORKER_COMMANDS:
            raise ValueError(f"Unknown worker command {command!r}; expected one of {', '.join(WORKER_COMMANDS)}.")
        if workers:
            document = json.dumps({"command": command, "by": by, "at": time.time()})
            self.client.hset(self.keys.control(), mapping=dict.fromkeys(workers, document))

    @translate_errors
    def pending_control(self) -> dict[str, dict[str, Any]]:
        """Return the commands not yet taken by a supervisor: worker name -> {"command", "by", "at"}."""
        return {name.decode(): json.loads(raw) for name, raw in self.client.hgetall(self.keys.control()).items()}

    def take_control(self, workers: Sequence[str]) -> dict[str, str]:
        """Take (and remove) the pending commands of `workers`: worker name -> "quiet" or "stop"."""
        if not workers:
            return {}
        reply = self.scripts.take_control(workers)
        return {reply[i].decode(): json.loads(reply[i + 1])["command"] for i in range(0, len(reply), 2)}

    @translate_errors
    def live_workers(self) -> list[dict[str, Any]]:
        """Return the last heartbeat document of each live worker process, with `heartbeat_age_s` added.

        Live means its heartbeat is at most `worker_timeout` old by the server's clock.
        """
        # The clock of the node holding the heartbeats, which scored them (a cluster has one per node).
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self.keys.workers(), 0, -1, withscores=True)
        (seconds, micros), entries = pipe.execute()
        now = seconds + micros / 1e6
        ages = {name.decode(): now - beat for name, beat in entries if now - beat <= self.config.worker_timeout}
        if not ages:
            return []
        documents = self.client.mget([self.keys.worker(name) for name in ages])
        return [
            {**json.loads(raw), "worker": name, "heartbeat_age_s": round(age, 3)}
            for (name, age), raw in zip(ages.items(), documents, strict=True)
            if raw is not None
        ]

    @translate_errors
    def worker_document(self, name: str) -> dict | None:
        """Return a worker's last heartbeat document, or None once it expired or the worker said goodbye."""
        raw = self.client.get(self.keys.worker(name))
        return None if raw is None else json.loads(raw)

    @translate_errors
    def queue_stats(self) -> dict[str, dict[Segment, int]]:
        """Return, for every queue, the number of tasks in each segment."""
        names = self.queue_names()
        partitions = [self.keys_for(p) for p in self.covered_partitions()]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for segment in Segment:
                for keys in partitions:
                    pipe.zcard(keys.segment(name, segment))
        counts = iter(pipe.execute())
        return {name: {segment: sum(next(counts) for _ in partitions) for segment in Segment} for name in names}

    @translate_errors
    def oldest_ready_enqueued_at(self, queue_names: Sequence[str]) -> dict[str, datetime | None]:
        """Return when each queue's oldest ready task was enqueued, for its latency.

        Reads the head and tail of the ready set only (two entries, whatever its depth):
        exact when the queue uses one or two priorities, a lower bound on age otherwise.
        """
        partitions = [self.keys_for(p) for p in self.covered_partitions()]
        pipe = self.client.pipeline(transaction=False)
        for name in queue_names:
            for keys in partitions:
                key = keys.segment(name, Segment.READY)
                pipe.zrange(key, 0, 0, withscores=True)
                pipe.zrange(key, -1, -1, withscores=True)
        replies = pipe.execute()
        width = 2 * len(partitions)
        out: dict[str, datetime | None] = {}
        for index, name in enumerate(queue_names):
            rows = [row for reply in replies[width * index : width * (index + 1)] for row in reply]
            oldest = min((int(score) % PRIORITY_BAND for _, score in rows), default=None)
            out[name] = None if oldest is None else datetime.fromtimestamp(oldest / 1000, UTC)
        return out

    @translate_errors
    def history(self, queue_name: str, *, minutes: int = 60, now: float | None = None) -> dict[str, list]:
        """Return a queue's per-minute history, oldest first, up to 24 hours.

        Series: tasks `enqueued`, `finished` (either outcome), `failed`, and `latency_s`, the oldest
        ready task's largest age sampled by a broker that minute (None where none was sampled).
        """
        minutes = max(1, min(minutes, HISTORY_MINUTES))
        current = int((time.time() if now is None else now) // 60)
        span = range(current - minutes + 1, current + 1)
        series = ("ingress", "egress", "failed", "latency")
        sums = {name: [0] * minutes for name in series[:3]}
        latency: list[int | None] = [None] * minutes
        for partition in self.covered_partitions():
            keys = self.keys_for(partition)
            values = self.client.mget([keys.throughput(queue_name, name, m) for name in series for m in span])
            for i, name in enumerate(series[:3]):
                sums[name] = [a + int(v or 0) for a, v in zip(sums[name], values[i * minutes : (i + 1) * minutes])]
            for i, v in enumerate(values[3 * minutes :]):
                if v is not None:
                    latency[i] = max(int(v), latency[i] or 0)
        return {
            "enqueued": sums["ingress"],
            "finished": sums["egress"],
            "failed": sums["failed"],
            "latency_s": [None if v is None else v / 1000 for v in latency],
        }

    @translate_errors
    def totals(self) -> dict[str, dict[str, int]]:
        """Return each queue's monotonic counters since first use: enqueued, finished (any outcome), failed."""
        names = self.queue_names()
        partitions = [self.keys_for(p) for p in self.covered_partitions()]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for keys in partitions:
                pipe.hmget(keys.totals(name), ("enqueued", "finished", "failed"))
        rows = iter(pipe.execute())
        out = {}
        for name in names:
            sums = [0, 0, 0]
            for _ in partitions:
                sums = [a + int(v or 0) for a, v in zip(sums, next(rows), strict=True)]
            out[name] = dict(zip(("enqueued", "finished", "failed"), sums, strict=True))
        return out

    @translate_errors
    def throughput(self, queue_name: str, *, minutes: int = 60, now: float | None = None) -> dict[str, list[int]]:
        """Return tasks in (`ingress`) and out (`egress`) of a queue per minute, oldest first."""
        current = int((time.time() if now is None else now) // 60)
        span = range(current - minutes + 1, current + 1)
        values = [0] * (2 * minutes)
        for partition in self.covered_partitions():
            keys = self.keys_for(partition)
            names = [keys.throughput(queue_name, d, m) for d in ("ingress", "egress") for m in span]
            values = [a + int(v or 0) for a, v in zip(values, self.client.mget(names), strict=True)]
        return {"ingress": values[:minutes], "egress": values[minutes:]}

    # -- console tooling (see threadmill.api) ------------------------------------------

    def peek_matching(
        self,
        queue_name: str,
        *,
        segment: Segment | str,
        needles: Sequence[str],
        offset: int = 0,
        count: int = 50,
        scan_limit: int = 100_000,
        newest_first: bool | None = None,
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
        newest_first = segment in NEWEST_FIRST if newest_first is None else newest_first
        if len(self.covered_partitions()) == 1:
            if needles:
                reply = self.scripts.peek_matching(
                    queue_name, segment, offset, count, newest_first, scan_limit, needles
                )
                first_row, complete = 3, bool(int(reply[1]))
            else:
                # Nothing to match: a plain page read by rank, at any depth.
                reply = self.scripts.peek(queue_name, segment, offset, count, newest_first)
                first_row, complete = 2, True
            rows, total = [reply[i : i + 9] for i in range(first_row, len(reply), 9)], int(reply[0])
        else:
            # Every partition's first offset + count matches, merged in queue order.
            replies = [
                s.peek_matching(queue_name, segment, 0, offset + count, newest_first, scan_limit, needles)
                if needles
                else s.peek(queue_name, segment, 0, offset + count, newest_first)
                for s in self._partition_scripts()
            ]
            first_row = 3 if needles else 2
            complete = all(bool(int(reply[1])) for reply in replies) if needles else True
            rows = merge_rows([(reply, first_row) for reply in replies], newest_first, offset + count)[0][offset:]
            total = sum(int(reply[0]) for reply in replies)
        items = [self._peeked(queue_name, segment, row) for row in rows]
        if segment is Segment.DEFERRED:
            # A deferred task's score is when it runs (a retry's backoff, not the task's own run_after).
            items = _with_run_after(items, [codec.moment(row[8]) for row in rows])
        return Page(items, total), complete

    def requeue_many(
        self, queue_name: str, *, segment: Segment | str, task_ids: Iterable[str], force: bool = False
    ) -> list[str]:
        """Requeue the given tasks of one segment to ready in one script; return the ids that moved.

        A running task's abandoned attempt is recorded (its worker id kept, an
        `AttemptAbandoned` error added). Without `force` a running task moves only when its
        lease is overdue or its worker's heartbeat is older than `worker_timeout` (a worker with
        no heartbeat: the lease is older than that), checked in the same script as the move;
        `live_leases` tells which would be skipped.
        """
        segment = Segment.parse(segment)
        ids = list(task_ids)
        return self._requeue_batch(queue_name, segment, ids, (), force, "requeue_many") if ids else []

    def requeue_matching(
        self, queue_name: str, *, segment: Segment | str, needles: Sequence[str] = (), force: bool = False
    ) -> list[str]:
        """Requeue every task of a segment whose document contains every needle, one window per script call.

        Returns the ids that moved. The walk keeps a (score, id) cursor, so tasks leaving or
        joining the segment meanwhile never make it skip one that stays. Each task moves
        atomically; a crash between windows leaves the rest where they were. Running tasks
        follow `requeue_many`'s rules, `force` included.
        """
        segment = Segment.parse(segment)
        window, newest_first = self.config.batch_size, segment in NEWEST_FIRST
        moved: list[str] = []
        for scripts in self._partition_scripts():
            cursor = (b"", b"")
            while entries := scripts.scan(queue_name, segment, cursor, window, newest_first):
                ids = [task_id.decode() for task_id, _ in entries]
                moved += self._requeue_batch(queue_name, segment, ids, needles, force, "requeue_matching")
                if len(entries) < window:
                    break
                cursor = (entries[-1][1], entries[-1][0])
        return moved

    def live_leases(self, queue_name: str, task_ids: Iterable[str]) -> list[str]:
        """Return those of the given tasks running under a live lease: the ones requeue_many skips without force."""
        live: list[str] = []
        heartbeats = None
        options = self.config
        for partition, ids in by_partition(task_ids, str).items():
            if partition and heartbeats is None:
                heartbeats = self.settled_heartbeat_ages()
            given = heartbeats if partition else None
            live += self.scripts_for(partition).live_leases(
                queue_name, ids, options.worker_timeout, given, options.heartbeat_settle
            )
        return live

    @translate_errors
    def heartbeat_reading(self) -> HeartbeatReading:
        """Return every worker's last heartbeat with the clock and uptime of the server holding them, in one round trip.

        One pipeline on one connection: a restart in between breaks it, so the three never mix
        two lives of the server.
        """
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrangebyscore(self.keys.workers(), "-inf", "+inf", withscores=True)
        pipe.info("server")
        (seconds, micros), entries, server = pipe.execute()
        beats = {name.decode(): beat for name, beat in entries}
        return HeartbeatReading(seconds + micros / 1e6, beats, float(server.get("uptime_in_seconds", math.inf)))

    def settled_heartbeat_ages(self) -> dict[str, float]:
        """Return every worker's heartbeat age for a script on a partition above 0; 0 each while partition 0 settles.

        Right after that server restarted, the heartbeats it restored are old though live workers
        have had no time to report yet (`heartbeat_settle`): none of them is silent until then.
        """
        reading = self.heartbeat_reading()
        settling = reading.settles_in(self.config.heartbeat_settle) > 0
        return {name: 0.0 if settling else reading.now - beat for name, beat in reading.beats.items()}

    @translate_errors
    def heartbeat_ages(self) -> dict[str, float]:
        """Return every worker in the workers set with its heartbeat's age, seconds by partition 0's clock.

        Scripts on other partitions take them in ARGV: their slot does not hold the workers set.
        """
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrangebyscore(self.keys.workers(), "-inf", "+inf", withscores=True)
        (seconds, micros), entries = pipe.execute()
        now = seconds + micros / 1e6
        return {name.decode(): now - beat for name, beat in entries}

    def _requeue_batch(
        self, queue_name: str, segment: Segment, ids: list[str], needles: Sequence[str], force: bool, by: str
    ) -> list[str]:
        moved: list[str] = []
        for partition, group in by_partition(ids, str).items():
            moved += self._requeue_partition(partition, queue_name, segment, group, needles, force, by)
        return moved

    def _requeue_partition(
        self, partition: int, queue_name: str, segment: Segment, ids: list[str], needles, force: bool, by: str
    ) -> list[str]:
        timeout, settle = self.config.worker_timeout, self.config.heartbeat_settle
        scripts = self.scripts_for(partition)
        if segment is not Segment.RUNNING:
            entries = [(task_id, "", "") for task_id in ids]
            return scripts.requeue_many(queue_name, segment, entries, needles, force, timeout)[0]
        heartbeats = self.settled_heartbeat_ages() if partition and not force else None
        by = f"{by} (forced)" if force else f"{by} (its lease overdue or its worker silent)"
        moved: list[str] = []
        # The fence refuses a task leased again since it was read; read it again, a few times.
        for _ in range(REQUEUE_ROUNDS):
            entries = self._abandoned_entries(queue_name, ids, needles, by)
            if not entries:
                break
            done, ids = scripts.requeue_many(queue_name, segment, entries, needles, force, timeout, heartbeats, settle)
            moved += done
            if not ids:
                break
        return moved

    def _abandoned_entries(
        self, queue_name: str, task_ids: Sequence[str], needles: Sequence[str], by: str
    ) -> list[tuple[str, str, str]]:
        """Read running tasks and return (id, lease token, document with the abandoned attempt) for each."""
        pipe = self.client.pipeline(transaction=False)
        for task_id in task_ids:
            pipe.hmget(self.task_keys(task_id).task(task_id), TASK_FIELDS)
        encoded = [needle.encode() for needle in needles]
        entries = []
        for task_id, fields in zip(task_ids, translate_errors(pipe.execute)(), strict=True):
            if fields[2] == b"running" and all(needle in fields[0] for needle in encoded):
                entries.append(
                    (task_id, codec.text(fields[6]), self.abandoned_document(task_id, queue_name, fields, by))
                )
        return entries

    def abandoned_document(self, task_id: str, queue_name: str, fields: Sequence[bytes | None], by: str) -> str:
        """Return a running task's document with its attempt recorded as abandoned by `by`; "" if unreadable.

        `fields` are the task hash's TASK_FIELDS. An unreadable payload is kept as it is
        (the caller sends "") and the abandoned attempt is only logged.
        """
        data, _, _, started_at, worker, lease_started, token, _, _ = fields
        worker_name = codec.text(worker)
        try:
            result = codec.decode(
                data,
                Segment.RUNNING,
                started_at=started_at,
                lease_worker=worker_name,
                lease_started_at=codec.moment(lease_started),
                lease_token=codec.text(token),
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            logger.warning(
                "Task %s on queue %s was requeued while worker %s ran it, by %s; its payload is unreadable "
                "(%s: %s), so the abandoned attempt is not recorded in it.",
                task_id, queue_name, worker_name, by, type(e).__name__, e,
            )  # fmt: skip
            return ""
        leased_at = "an unknown time" if result.lease_started_at is None else result.lease_started_at.isoformat()
        record_abandoned(
            result,
            f"The attempt of worker {worker_name}, leased at {leased_at}, was abandoned: "
            f"the task was requeued while it ran, by {by}.",
        )
        return codec.encode_result(result)

    @translate_errors
    def in_segment(self, queue_name: str, segment: Segment | str, task_ids: Sequence[str]) -> list[str]:
        """Return those of the given task ids that are in one segment of a queue now."""
        segment = Segment.parse(segment)
        present: set[str] = set()
        for partition, ids in by_partition(task_ids, str).items():
            scores = self.client.zmscore(self.keys_for(partition).segment(queue_name, segment), ids)
            present.update(task_id for task_id, score in zip(ids, scores, strict=True) if score is not None)
        return [task_id for task_id in task_ids if task_id in present]

    @translate_errors
    def peek_task(self, task_id: str) -> ThreadmillTaskResult | UnreadableTask:
        """Return one task in whatever segment it is, an unreadable one as stored; TaskResultDoesNotExist if none."""
        keys = self.task_keys(task_id)
        fields = self.client.hmget(keys.task(task_id), ("queue", "segment"))
        if fields[0] is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        queue_name, segment = fields[0].decode(), Segment(fields[1].decode())
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(keys.task(task_id), TASK_FIELDS)
        pipe.get(keys.result(task_id))
        pipe.zscore(keys.segment(queue_name, segment), task_id)
        fields, old_layout_result, score = pipe.execute()
        data, _, _, started_at, worker, lease_started, token, read_error, stored_result = fields
        stored_result = stored_result or old_layout_result
        if data is None:
            raise TaskResultDoesNotExist(f"No task with id {task_id!r} is stored.")
        row = [task_id.encode(), data, stored_result, started_at, worker, lease_started, token, read_error, score]
        return self._peeked(queue_name, segment, row)
