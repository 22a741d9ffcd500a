"""The reaper: takes back leases whose deadline passed on the server's clock.

Each claimed task is failed with `AcknowledgementTimeout`, or retried per its retry policy.
A claim gives the task a new fencing token, so two brokers never handle one task and a late
acknowledgement by the original worker is refused.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime

from ...base import UNREADABLE_PAYLOAD_ERRORS, Segment
from ...outcome import lease_expired_error, mark_failed, retry_delay
from .. import codec
from .passes import BrokerPass, Duty

logger = logging.getLogger("threadmill.broker")

#: Seconds a reaper (or recovery) holds a claimed task while it decides its fate.
CLAIM_WINDOW_S = 60.0


class Reaper(Duty):
    """Fails or retries the tasks whose lease expired."""

    name = "reaper"

    def run_once(self, pass_: BrokerPass) -> int:
        """Reap every queue in every partition; return how many tasks were failed or retried."""
        return pass_.serve_each(self.reap)

    def reap(self, queue_name: str, partition: int | None = None) -> int:
        """Fail or retry every task of a queue whose lease expired (in one partition, or all); return how many."""
        if partition is None:
            return sum(self.reap(queue_name, p) for p in self.backend.covered_partitions())
        batch_size = self.backend.config.batch_size
        scripts = self.backend.scripts_for(partition)
        total = 0
        while True:
            reply = scripts.claim_expired(queue_name, batch_size, CLAIM_WINDOW_S, os.urandom(6).hex())
            rows = [reply[i : i + 6] for i in range(0, len(reply), 6)]
            for row in rows:
                total += self._settle(queue_name, *row)
            if len(rows) < batch_size:
                return total

    def _settle(self, queue_name: str, task_id, data, worker, lease_started, started_at, token) -> int:
        task_id, token = task_id.decode(), token.decode()
        if not data:
            logger.info("Expired lease of task %s on queue %s: the task is already gone.", task_id, queue_name)
            return 0
        try:
            result = codec.decode(
                data,
                Segment.RUNNING,
                started_at=started_at or None,
                lease_worker=worker.decode(),
                lease_started_at=codec.moment(lease_started),
                lease_token=token,
            )
        except UNREADABLE_PAYLOAD_ERRORS as e:
            self.backend.quarantine_unreadable(task_id, queue_name, Segment.RUNNING, e, token, "reap")
            return 1
        lease_ttl = self.backend.config.lease_ttl
        error = lease_expired_error(
            f"The lease of worker {worker.decode()} expired after {lease_ttl:g} s without an acknowledgement."
        )
        mark_failed(result, error, datetime.now(UTC))
        delay = retry_delay(result)
        if delay is not None:
            logger.warning("Task %s lease expired; retrying in %s.", task_id, delay)
            self.backend.requeue(result, run_after=delay)
        else:
            logger.error("Task %s lease expired; marked failed.", task_id)
            self.backend.acknowledge(result)
        return 1
