"""The sweeper: releases waiting workflow tasks whose parents are final but were never settled.

The script that records a parent's final outcome releases its children (acknowledge.lua, which the
worker, the reaper and recovery call, and cancel.lua); an older release's worker or cancel records
final outcomes without doing so, and a call's budget may leave children unvisited. This duty settles those parents through the same Lua (`sweep_waiting.lua`), so
such children start within `SWEEP_INTERVAL_S` or two. A queue without waiting tasks costs one
script call running one ZRANGE a sweep: an idle pool pays 0.4 commands a second per queue for it.
Each sweep also continues the releases a call cut short at its budget that no acknowledgement
continued (the acknowledging worker stopped between the two calls): one script call running one
LLEN when the settling list is empty, 0.4 commands a second (per partition: a workflow lives in one).

A sweep reads every waiting task's pending set and each parent in it: a pass over a 10,000-task
fan-out's children, or over one join with 9,999 parents, held the server 0.23-0.26 s (this 2-core VM
at load 4; docs/explanation/workflows.md). So the broker's first pass leaves the sweeper out
(`runs_at_start`): a pool starts to drain what was queued meanwhile, a workflow's tasks among them,
and the first sweep comes one interval later, when what it repairs still starts within the interval or two.
"""

from __future__ import annotations

from .passes import BrokerPass, Duty

#: Most waiting tasks one sweep call looks at.
SWEEP_BATCH_SIZE = 500
#: Most sweep calls one queue gets a sweep (each visits at most the script's budget of children).
MAX_SWEEP_CALLS = 100
#: Least time between two sweeps, seconds ("within seconds", issue 32; each costs an idle queue a ZCARD).
SWEEP_INTERVAL_S = 5.0


class Sweeper(Duty):
    """Settles the final parents of waiting tasks that no acknowledgement settled."""

    name = "sweeper"
    runs_at_start = False

    def interval(self) -> float:
        """Return `SWEEP_INTERVAL_S`, or the broker's own interval when that is longer."""
        return max(SWEEP_INTERVAL_S, self.backend.config.broker_interval)

    def run_once(self, pass_: BrokerPass) -> int:
        """Sweep every queue in every partition, then continue the releases cut short; return how many were settled."""
        swept = pass_.serve_each(self.sweep)
        # A workflow lives in one partition, whose settling list holds its releases cut short.
        settling = (pass_.attempt(p, self.backend.finish_settling, (p,)) or 0 for p in pass_.partitions)
        return swept + sum(settling)

    def sweep(self, queue_name: str, partition: int) -> int:
        """Sweep one queue's waiting segment in one partition, a batch a call; return how many parents were settled."""
        scripts = self.backend.scripts_for(partition)
        settled, first = 0, 0
        for _ in range(MAX_SWEEP_CALLS):
            done, looked = scripts.sweep_waiting(queue_name, first, SWEEP_BATCH_SIZE, self.backend.config.result_ttl)
            settled += done
            if not done:
                if looked < SWEEP_BATCH_SIZE:
                    break
                first += looked
            # Else released tasks left the segment and a budget may have cut the call short: look again.
        return settled
