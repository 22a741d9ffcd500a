"""The recounter: counts in their workflow's record the final outcomes no script counted, and finishes the record.

The scripts of this release count a workflow task's final outcome as they record it (lib/workflow.lua's
`counted` field). An older release's acknowledge or cancel, which predate workflows, record it without
counting; the sweeper settles such a task when a child waits on it, but a leaf (no children) is never
reached there, so its record's counts would stay short and the record would never finish nor expire.
This duty walks each partition's `workflows` index (`recount_workflows.lua`), `RECOUNT_RECORDS` records and at most
`RECOUNT_TASKS` task hashes a call, resuming where the last call stopped. A server without workflows
pays one script call running one ZRANGE a partition every `RECOUNT_INTERVAL_S`. A pass reads an open
workflow's every task hash, so like the sweeper it is left out of the broker's first pass (`runs_at_start`):
its first walk comes one interval after the pool's start, not beside the drain that start begins. The
same walk takes out of the index the ids whose record has expired (finished, then `result_ttl` later), so
the index, the console's list and the next walks do not keep paying for history.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .passes import BrokerPass, Duty

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

#: Most workflow records one call looks at (a finished one costs one HMGET, a gone one an HMGET and a ZREM).
RECOUNT_RECORDS = 500
#: Most task hashes one call reads: a call counting 1,000 tasks of a 10,000-task graph took the server a
#: median 15 ms, one reading 1,000 counted ones 9 ms (on this 2-core VM at load 4; docs/explanation/workflows.md).
RECOUNT_TASKS = 1000
#: Most calls one pass makes before it leaves the rest of the walk to the next pass.
MAX_RECOUNT_CALLS = 10
#: Least time between two passes, seconds: an uncounted leaf is a rolling deploy's leftover, so a
#: record finishing within a minute is enough, and an idle server pays 2 commands in 30 s.
RECOUNT_INTERVAL_S = 30.0


class Recounter(Duty):
    """Counts the final outcomes an older release left uncounted in their workflows' records."""

    name = "recounter"
    runs_at_start = False

    def __init__(self, backend: RedisTaskBackend) -> None:
        super().__init__(backend)
        #: Where the walk resumes in each partition's index: (rank in the index, task in that workflow's graph).
        self.cursors: dict[int, tuple[int, int]] = {}

    def interval(self) -> float:
        """Return `RECOUNT_INTERVAL_S`, or the broker's own interval when that is longer."""
        return max(RECOUNT_INTERVAL_S, self.backend.config.broker_interval)

    def run_once(self, pass_: BrokerPass) -> int:
        """Walk on through each partition's index (a workflow lives in one); return how many outcomes were counted."""
        return sum(pass_.attempt(p, self.recount, p) or 0 for p in pass_.partitions)

    def recount(self, partition: int = 0) -> int:
        """Make up to `MAX_RECOUNT_CALLS` calls from a partition's cursor (its index's start after its end); return the count."""
        scripts, total = self.backend.scripts_for(partition), 0
        for _ in range(MAX_RECOUNT_CALLS):
            counted, cursor, at_end = scripts.recount_workflows(
                self.cursors.get(partition, (0, 0)), RECOUNT_RECORDS, RECOUNT_TASKS, self.backend.config.result_ttl
            )
            total += counted
            self.cursors[partition] = (0, 0) if at_end else cursor
            if at_end:
                break
        return total
