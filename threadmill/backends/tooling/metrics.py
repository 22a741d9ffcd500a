"""The backend's half of `threadmill.api.metrics`: counts and counters whose cost does not grow with the tasks stored.

Segment sizes (ZCARD), the oldest ready task (two-entry ZRANGEs) and the totals since first
use (HMGET), each one pipeline over every queue and partition; the per-task-path counts
(`threadmill.backends.taskstats`), one pipeline of HGETALLs on partition 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from ...base import Segment
from ...limits import QueueLimit, decode, next_token_s, share
from ..errors import translate_errors
from ..keys import PRIORITY_BAND
from ..taskstats import PathStats, parse_hash
from .host import ToolingHost

#: A queue's totals: enqueued, finished (any outcome) and failed; cancelled before they ran,
#: abort requests (one a task), runs an abort ended and runs that passed their time limit
#: (then retried or failed). Each is counted by the script that stores the outcome. Last, enqueue
#: calls sent again after a transient error (`enqueue_retry`) and the tasks such a retry found
#: already stored, counted by the enqueuing process once the call succeeded.
TOTALS = (
    "enqueued", "finished", "failed", "cancelled", "abort_requested", "aborted", "timed_out",
    "enqueue_retries", "already_stored",
)  # fmt: skip


class MetricsTooling(ToolingHost):
    """Counting every queue's tasks per segment, its latency and its totals."""

    # From QueueTooling (mixed in beside this class).
    queue_names: Callable[[], list[str]]

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
    def totals(self) -> dict[str, dict[str, int]]:
        """Return each queue's monotonic counters since first use, by the names in `TOTALS`."""
        names = self.queue_names()
        partitions = [self.keys_for(p) for p in self.covered_partitions()]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for keys in partitions:
                pipe.hmget(keys.totals(name), TOTALS)
        rows = iter(pipe.execute())
        out = {}
        for name in names:
            sums = [0] * len(TOTALS)
            for _ in partitions:
                sums = [a + int(v or 0) for a, v in zip(sums, next(rows), strict=True)]
            out[name] = dict(zip(TOTALS, sums, strict=True))
        return out

    @translate_errors
    def task_stats(self, *, minutes: int | None = 60) -> list[PathStats]:
        """Return the per-task-path counts of every queue over the last `minutes` (None: since first use).

        Up to 120 minutes are read minute by minute; longer spans by the hour (the current hour
        whole), at most 25 hours back (the history kept). Sorted by queue, then path.
        """
        names = self.queue_names()
        keys = self.keys_for(0)
        if minutes is None:
            periods = ["total"]
        elif minutes <= 120:
            now = int(time.time() // 60)
            periods = [f"m{m}" for m in range(now - max(1, minutes) + 1, now + 1)]
        else:
            now = int(time.time() // 3600)
            hours = min(25, -(-minutes // 60))
            periods = [f"h{h}" for h in range(now - hours + 1, now + 1)]
        pipe = self.client_for(keys.workers()).pipeline(transaction=False)
        for name in names:
            for period in periods:
                pipe.hgetall(keys.task_stats(name, period))
        replies = iter(pipe.execute())
        found: dict[tuple[str, str], PathStats] = {}
        for name in names:
            for _ in periods:
                parse_hash(name, next(replies), found)
        return [found[key] for key in sorted(found)]

    @translate_errors
    def task_stats_by_minute(self, queue_name: str, path: str, *, minutes: int = 60) -> list[tuple[int, PathStats]]:
        """Return one task path's counts on one queue for each of the last `minutes` (epoch minute, counts), oldest first."""
        keys = self.keys_for(0)
        now = int(time.time() // 60)
        span = range(now - max(1, min(minutes, 25 * 60)) + 1, now + 1)
        pipe = self.client_for(keys.workers()).pipeline(transaction=False)
        for minute in span:
            pipe.hgetall(keys.task_stats(queue_name, f"m{minute}"))
        out = []
        for minute, reply in zip(span, pipe.execute(), strict=True):
            found: dict[tuple[str, str], PathStats] = {}
            parse_hash(queue_name, {k: v for k, v in reply.items() if _named(k, path)}, found)
            out.append((minute, found.get((queue_name, path), PathStats(queue_name, path))))
        return out


def _named(field: bytes | str, path: str) -> bool:
    name = field.decode() if isinstance(field, bytes) else field
    return name.startswith(path + "|")


@dataclass(frozen=True, slots=True)
class TaskLimitState:
    """A task path's per-task limit (`@task(concurrency=, rate=)`), its runs leased now and its next rate token.

    `next_token_s` is None while the rate has a token left in some partition (or there is no rate).
    """

    path: str
    limit: QueueLimit
    running: int
    next_token_s: float | None

    @property
    def at_concurrency(self) -> bool:
        return self.limit.concurrency is not None and self.running >= self.limit.concurrency

    def holding_text(self) -> str:
        """What holds the path's tasks back, in words: "app.tasks.x (3/3 running)" or "(100/m, next in 0.4 s)"."""
        if self.at_concurrency:
            return f"{self.path} ({self.running}/{self.limit.concurrency} running)"
        return f"{self.path} ({self.limit.rate}, next in {self.next_token_s or 0:.1f} s)"


class TaskLimitTooling(ToolingHost):
    """Reading the per-task limits the enqueues recorded, and what runs against them."""

    @translate_errors
    def task_limits(self) -> dict[str, TaskLimitState]:
        """Return each task path with a per-task limit: two pipelines a partition that has any.

        A path's running count is the ids in its set whose task is still running (the set is
        trimmed only when the limit binds, so it may hold finished ones).
        """
        found: dict[str, list] = {}
        partitions = self.covered_partitions()
        for partition in partitions:
            keys = self.keys_for(partition)
            client = self.client_for(keys.task_limits())
            specs = {path.decode(): decode(spec) for path, spec in client.hgetall(keys.task_limits()).items()}
            if not specs:
                continue
            pipe = client.pipeline(transaction=False)
            pipe.time()
            for path, limit in specs.items():
                pipe.smembers(f"{keys.task_limit_prefix()}{path}:running")
                # The N-th newest lease time (N this partition's share): None while fewer were kept.
                tokens = 1 if limit.rate is None else share(limit.rate.count, partition, len(partitions))
                pipe.lindex(f"{keys.task_limit_prefix()}{path}:lease-times", tokens - 1)
            reply = pipe.execute()
            members = [list(reply[1 + 2 * i]) for i in range(len(specs))]
            check = client.pipeline(transaction=False)
            for member in (m for ids in members for m in ids):
                check.hget(keys.task(member.decode()), "segment")
            segments = iter(check.execute() if any(members) else [])
            for i, (path, limit) in enumerate(specs.items()):
                running = sum(1 for _ in members[i] if next(segments) == b"running")
                found.setdefault(path, [limit, 0, []])
                found[path][1] += running
                found[path][2].append(next_token_s(limit.rate, reply[2 + 2 * i], reply[0]))
        return {
            path: TaskLimitState(path, limit, running, None if None in waits else min(waits))
            for path, (limit, running, waits) in sorted(found.items())
        }

    @translate_errors
    def holding_task_limits(self) -> dict[str, list[TaskLimitState]]:
        """Return, for each queue that has held a task with a per-task limit, the limited paths at their limit now.

        A path's tasks may wait in any of the queues it was sent to: a queue is listed with every
        path holding, not only its own (the stored data does not say which paths a queue holds).
        """
        holding = [s for s in self.task_limits().values() if s.at_concurrency or s.next_token_s is not None]
        if not holding:
            return {}
        marked: set[str] = set()
        for partition in self.covered_partitions():
            keys = self.keys_for(partition)
            marked.update(name.decode() for name in self.client_for(keys.limited_queues()).hkeys(keys.limited_queues()))
        return {name: holding for name in sorted(marked)}
