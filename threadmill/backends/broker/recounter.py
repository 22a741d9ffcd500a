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

A call cut short inside a graph names its workflow; the duty then reads that graph's text once itself and
hands the next calls its task ids, so a 10,000-task graph (650 kB) is not read again by each of its calls:
a graph only grows at its end, so the ids after the cursor are the ones read, and the script reads the text
only for what comes after them (a task added since).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .passes import BrokerPass, Duty

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

#: Most workflow records one call looks at (a finished one costs one HMGET, a gone one an HMGET and a ZREM).
RECOUNT_RECORDS = 500
#: Most task hashes one call reads: a call counting 1,000 tasks of a 10,000-task graph took the server a
#: median 15 ms, one reading 1,000 counted ones 3-4 ms; at 500 the longest was 3.8 ms (this 2-core VM at load 3-4;
#: docs/explanation/workflows.md).
RECOUNT_TASKS = 500
#: Most calls one pass makes before it leaves the rest of the walk to the next pass (a 10,000-task graph takes 20).
MAX_RECOUNT_CALLS = 20
#: Least time between two passes, seconds: an uncounted leaf is a rolling deploy's leftover, so a
#: record finishing within a minute is enough, and an idle server pays 2 commands in 30 s.
RECOUNT_INTERVAL_S = 30.0
#: A task id in a graph's text, as recount_workflows.lua finds it: the quoted UUID before `, [`.
ID_IN_GRAPH = re.compile(r'"([0-9a-fA-F]+-[0-9a-fA-F]+-[0-9a-fA-F]+-[0-9a-fA-F]+-[0-9a-fA-F]+)", \[')


class Recounter(Duty):
    """Counts the final outcomes an older release left uncounted in their workflows' records."""

    name = "recounter"
    runs_at_start = False

    def __init__(self, backend: RedisTaskBackend) -> None:
        super().__init__(backend)
        #: Where the walk resumes in each partition's index: (rank in the index, task in that workflow's graph).
        self.cursors: dict[int, tuple[int, int]] = {}
        #: Per partition, the workflow the cursor is inside and its ids with where each ends in its graph's text.
        self.graphs: dict[int, tuple[str, list[tuple[str, int]]]] = {}

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
            cursor = self.cursors.get(partition, (0, 0))
            budget, given = (RECOUNT_RECORDS, RECOUNT_TASKS), self._given(partition, cursor)
            counted, cursor, at_end, inside = scripts.recount_workflows(
                cursor, budget, self.backend.config.result_ttl, given
            )
            total += counted
            self.cursors[partition] = (0, 0) if at_end else cursor
            if inside and self.graphs.get(partition, ("",))[0] != inside:
                self.graphs[partition] = (inside, self._read_graph(partition, inside))
            elif not inside:
                self.graphs.pop(partition, None)
            if at_end:
                break
        return total

    def _read_graph(self, partition: int, workflow_id: str) -> list[tuple[str, int]]:
        graph = self.backend.client.hget(self.backend.keys_for(partition).workflow(workflow_id), "graph") or b""
        # Places count bytes from 1 where the match ends, as Lua's string.find does.
        return [(m.group(1), m.end()) for m in ID_IN_GRAPH.finditer(graph.decode("latin-1"))]

    def _given(self, partition: int, cursor: tuple[int, int]) -> tuple[str, int, list[str]]:
        """The ids after `cursor` in the graph read for its workflow, at most a call's budget; none when there is none."""
        workflow_id, ids = self.graphs.get(partition, ("", []))
        after = [entry for entry in ids if entry[1] > cursor[1]][:RECOUNT_TASKS]
        if not after:
            return "", 0, []
        return workflow_id, after[-1][1], [task_id for task_id, _ in after]
