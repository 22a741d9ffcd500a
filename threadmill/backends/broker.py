"""`RedisBroker`: the maintenance a worker supervisor runs beside its workers.

The **mover** promotes deferred tasks whose run_after has passed. The **reaper** claims
leases whose deadline passed on the server's clock, then fails each task with
`AcknowledgementTimeout` or retries it per its retry policy. A claim gives the task a
new fencing token, so two brokers never handle one task and a late acknowledgement by
the original worker is refused.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..outcome import lease_expired_error, mark_failed, retry_delay
from . import codec
from .base import UNREADABLE_PAYLOAD_ERRORS, Segment

if TYPE_CHECKING:
    from .redis import RedisTaskBackend

logger = logging.getLogger("threadmill.broker")

#: Seconds a reaper holds a claimed task while it decides its fate.
CLAIM_WINDOW_S = 60.0
#: Most expired ids a trim call drops from each finished segment.
TRIM_BATCH_SIZE = 1000


class RedisBroker:
    """Runs the mover and the reaper for some queues of one backend."""

    def __init__(self, backend: RedisTaskBackend, queue_names: list[str] | None = None) -> None:
        self.backend = backend
        self.queue_names = queue_names

    def queues(self) -> list[str]:
        return self.queue_names or self.backend.queue_names()

    def run(self, stop: threading.Event) -> None:
        """Run passes every `broker_interval` until `stop` is set."""
        while not stop.is_set():
            self.run_once()
            stop.wait(self.backend.options.broker_interval)

    def run_once(self) -> tuple[int, int]:
        """Run one mover and one reaper pass over every queue; return (promoted, reaped)."""
        promoted = reaped = 0
        for queue_name in self.queues():
            promoted += self.move(queue_name)
            reaped += self.reap(queue_name)
            self.trim(queue_name)
        return promoted, reaped

    def move(self, queue_name: str) -> int:
        """Promote every due deferred task of a queue to ready; return how many."""
        batch_size = self.backend.options.batch_size
        total = 0
        while (moved := self.backend.scripts.promote(queue_name, batch_size)) > 0:
            total += moved
            if moved < batch_size:
                break
        return total

    def trim(self, queue_name: str) -> int:
        """Drop the finished ids of a queue whose task data expired with `result_ttl`; return how many.

        `acknowledge` trims only the segment it writes to, so without this an idle queue
        would keep listing and counting tasks that are gone.
        """
        result_ttl = self.backend.options.result_ttl
        total = 0
        while (dropped := self.backend.scripts.trim_finished(queue_name, result_ttl, TRIM_BATCH_SIZE)) > 0:
            total += dropped
        return total

    def reap(self, queue_name: str) -> int:
        """Fail or retry every task of a queue whose lease expired; return how many."""
        batch_size = self.backend.options.batch_size
        total = 0
        while True:
            reply = self.backend.scripts.claim_expired(queue_name, batch_size, CLAIM_WINDOW_S, os.urandom(6).hex())
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
        lease_ttl = self.backend.options.lease_ttl
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
