"""The sweeper: releases waiting workflow tasks whose parents are final but were never settled.

The script that records a parent's final outcome releases its children (acknowledge.lua, which the
worker, the reaper and recovery call, and cancel.lua); an older release's worker or cancel records
final outcomes without doing so, and a call's budget may leave children unvisited. This duty settles those
parents through the same Lua (`sweep_waiting.lua`), so such children start within a `sweep_interval` or two.
A queue without waiting tasks costs one script call running one ZRANGE a sweep: an idle pool pays 0.4
commands a second per queue for it. Each sweep also continues the releases a call cut short at its budget
that no acknowledgement continued (the acknowledging worker stopped between the two calls): one script call
running one LLEN when the settling list is empty, 0.4 commands a second (per partition: a workflow lives in one).

A sweep reads every waiting task's pending set and each parent in it, `SWEEP_STEPS` steps a call (a parent
read, or a child a settle visits) from a cursor the script returns, so no call holds the server long: one
join with 9,999 parents was one call of 0.04-0.22 s, and is 20 calls of at most 3 ms now (docs/explanation/workflows.md). A sweep
makes at most `MAX_SWEEP_CALLS` calls a queue and keeps its cursor for the next when they run out. The
broker's first pass leaves the sweeper out (`runs_at_start`): a pool starts to drain what was queued meanwhile,
a workflow's tasks among them, and the first sweep comes one interval later, when what it repairs still
starts within the interval or two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .passes import BrokerPass, Duty

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

#: A sweep's place in a waiting segment: (rank, the waiting task to resume at or "", SSCAN cursor in its pending set).
SweepCursor = tuple[int, str, str]
#: Where a sweep of a waiting segment starts: its head.
SWEEP_START: SweepCursor = (0, "", "0")

#: Most waiting tasks one sweep call looks at.
SWEEP_BATCH_SIZE = 500
#: Most steps one sweep call takes: a waiting task looked at or a parent read (each 2-5 us of the server), or a
#: child a settle visits (4 steps); a call of 500 was a median 1-3 ms on a 10,000-task workflow (docs/explanation/workflows.md).
SWEEP_STEPS = 500
#: Most sweep calls one queue gets a sweep (a 9,999-parent join, all final, takes about 100); the next sweep resumes
#: where they stopped.
MAX_SWEEP_CALLS = 200


class Sweeper(Duty):
    """Settles the final parents of waiting tasks that no acknowledgement settled."""

    name = "sweeper"
    runs_at_start = False

    def __init__(self, backend: RedisTaskBackend) -> None:
        super().__init__(backend)
        #: Where a sweep cut short at `MAX_SWEEP_CALLS` resumes, by (queue, partition).
        self.cursors: dict[tuple[str, int], SweepCursor] = {}

    def interval(self) -> float:
        """Return the `sweep_interval` option, or the broker's own interval when that is longer."""
        return max(self.backend.config.sweep_interval, self.backend.config.broker_interval)

    def run_once(self, pass_: BrokerPass) -> int:
        """Sweep every queue in every partition, then continue the releases cut short; return how many were settled."""
        swept = pass_.serve_each(self.sweep)
        # A workflow lives in one partition, whose settling list holds its releases cut short.
        settling = (pass_.attempt(p, self.backend.finish_settling, (p,)) or 0 for p in pass_.partitions)
        return swept + sum(settling)

    def sweep(self, queue_name: str, partition: int) -> int:
        """Sweep one queue's waiting segment in one partition in bounded calls; return how many parents were settled."""
        scripts, ttl = self.backend.scripts_for(partition), self.backend.config.result_ttl
        cursor, settled = self.cursors.pop((queue_name, partition), SWEEP_START), 0
        for _ in range(MAX_SWEEP_CALLS):
            done, cursor, at_end = scripts.sweep_waiting(queue_name, cursor, SWEEP_BATCH_SIZE, SWEEP_STEPS, ttl)
            settled += done
            if at_end:
                return settled
        self.cursors[(queue_name, partition)] = cursor
        return settled
