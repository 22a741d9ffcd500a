"""Recovery: takes back the leases of worker processes that are gone.

A worker whose heartbeat is older than `worker_timeout` is gone, and so is one with none
once its lease is that old (a worker's first heartbeat goes out as it starts). A task that
never started goes back to ready as it was; one that was running goes back with the lost
attempt recorded (`WorkerLost`), unless it lost its worker `WORKER_LOSS_LIMIT` times in a
row. Every task of a lost lease becomes a suspect, whose next lease records its run's start
and finish on the server, so a later loss is blamed exactly; a lease without that record is
judged by the worker's last heartbeat, which may be one interval old. A claim gives the task
a new fencing token, as the reaper's does.

Recovery runs only once its broker has reached the server without a failure for
`heartbeat_settle` (`worker_timeout + socket_timeout`): after an outage every worker's
heartbeat is stale, and live workers need that long to send their next one. With several
partitions that server is partition 0's, which holds the heartbeats: another partition's
outage leaves them fresh, and a pass reads them there once for the other partitions.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from datetime import UTC, datetime

from ...base import UNREADABLE_PAYLOAD_ERRORS, Segment
from ...outcome import WORKER_LOSS_LIMIT, keeps_losing_its_worker, mark_failed, worker_lost_error
from .. import codec
from .passes import BrokerPass, Duty
from .reaper import CLAIM_WINDOW_S

logger = logging.getLogger("threadmill.broker")

#: Most running entries of one queue a recovery call looks through for a dead worker's leases.
RECOVERY_SCAN_LIMIT = 10_000


class Recovery(Duty):
    """Gives back or fails the tasks of lost worker processes."""

    name = "recovery"

    def run_once(self, pass_: BrokerPass) -> int:
        """Recover every queue in every partition once the pass trusts the heartbeats; return how many tasks."""
        if not pass_.trusts_heartbeats:
            return 0
        heartbeats = pass_.attempt(0, self.backend.heartbeat_ages) if len(pass_.partitions) > 1 else None
        total = 0
        for queue_name, partition in pass_.each():
            # Recovery needs this pass's view of the heartbeats, on partition 0.
            if pass_.reached(0):
                given = heartbeats if partition else None
                total += pass_.attempt(partition, self.recover, queue_name, partition, given) or 0
        return total

    def recover(self, queue_name: str, partition: int | None = None, heartbeats: dict[str, float] | None = None) -> int:
        """Take back every lease of a queue held by a worker whose heartbeat stopped, or never came; return how many.

        Partition 0 reads the workers set itself; another partition takes `heartbeats` (every
        worker's heartbeat age), read from partition 0 once per pass.
        """
        if partition is None:
            partitions = self.backend.covered_partitions()
            heartbeats = self.backend.heartbeat_ages() if len(partitions) > 1 else None
            return sum(self.recover(queue_name, p, heartbeats if p else None) for p in partitions)
        if partition and heartbeats is None:
            heartbeats = self.backend.heartbeat_ages()
        options = self.backend.config
        scripts = self.backend.scripts_for(partition)
        forget_after = options.lease_ttl + options.worker_timeout
        total = 0
        buffered_by_worker: dict[str, set[str]] = {}
        while True:
            reply = scripts.claim_abandoned(
                queue_name,
                options.worker_timeout,
                forget_after,
                options.batch_size,
                RECOVERY_SCAN_LIMIT,
                CLAIM_WINDOW_S,
                os.urandom(6).hex(),
                heartbeats,
                options.lease_ttl,
            )
            rows = [reply[i : i + 9] for i in range(1, len(reply), 9)]
            fates: Counter[tuple[str, str]] = Counter()
            for row in rows:
                fates[row[2].decode(), self._recover_one(queue_name, buffered_by_worker, *row)] += 1
            for (worker, fate), count in sorted(fates.items()):
                logger.warning(
                    "Worker %s is lost (no heartbeat): %d of its tasks on queue %s %s.", worker, count, queue_name, fate
                )
            total += len(rows)
            if len(rows) < options.batch_size:
                return total

    def _recover_one(
        self,
        queue_name: str,
        buffered_by_worker,
        task_id,
        data,
        worker,
        lease_started,
        started_at,
        token,
        age,
        progress,
        losses,
    ) -> str:
        """Settle one task claimed from a lost worker; return what became of it, for the log.

        `progress` is what the lost lease recorded ("leased", "started", "finished"), or empty when
        it recorded nothing (the task was no suspect, or its worker an older release): then the
        worker's last heartbeat decides, and the recorded errors count the losses in a row.
        """
        task_id, worker, token, progress = task_id.decode(), worker.decode(), token.decode(), progress.decode()
        if not data:
            return "were already gone"
        try:
            result = codec.decode(
                data,
                Segment.RUNNING,
                started_at=started_at or None,
                lease_worker=worker,
                lease_started_at=codec.moment(lease_started),
                lease_token=token,
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            self.backend.quarantine_unreadable(task_id, queue_name, Segment.RUNNING, e, token, "recover")
            return "were unreadable and quarantined"
        unblamed = self._unblamed(task_id, worker, progress, buffered_by_worker)
        if unblamed:
            self.backend.release([result])
            return unblamed
        lost = f"Worker {worker} sent no heartbeat for {float(age):.1f} s while this attempt ran; it was lost."
        error = worker_lost_error(lost)
        in_a_row = int(losses) if progress else None
        if keeps_losing_its_worker(result, error, in_a_row):
            times = in_a_row or WORKER_LOSS_LIMIT
            logger.error("Task %s lost its worker %d times in a row; marked failed.", task_id, times)
            error = worker_lost_error(f"{lost} That is {times} lost workers in a row: it is likely what kills them.")
            mark_failed(result, error, datetime.now(UTC))
            self.backend.acknowledge(result)
            return "kept losing their worker and were marked failed"
        result.errors.append(error)
        self.backend.requeue(result)
        return "were running and went back to ready, the lost attempt recorded"

    def _unblamed(
        self, task_id: str, worker: str, progress: str, buffered_by_worker: dict[str, set[str]]
    ) -> str | None:
        """Return what becomes of a lost lease's task whose run was not under way, or None when it was."""
        if progress == "finished":
            return "had finished unacknowledged and went back to ready, unblamed"
        if not progress:
            if worker not in buffered_by_worker:
                buffered_by_worker[worker] = self._buffered_on(worker)
            progress = "leased" if task_id in buffered_by_worker[worker] else "started"
        return "had not started and went back to ready" if progress == "leased" else None

    def _buffered_on(self, worker: str) -> set[str]:
        """Return the ids a worker's last heartbeat said were waiting in its buffer, not started.

        Only for leases that recorded no progress. Any other task it held is taken to have
        started: one leased after that heartbeat may have, and counting an attempt too many is
        safer than missing one that crashed it. One listed may have started since, too: it
        goes back unblamed, but as a suspect its next lease is recorded.
        """
        document = self.backend.worker_document(worker)
        buffered = None if document is None else document.get("buffered")
        return set(buffered) if isinstance(buffered, list) else set()
