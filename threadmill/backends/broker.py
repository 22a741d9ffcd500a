"""`RedisBroker`: the maintenance a worker supervisor runs beside its workers.

The **mover** promotes deferred tasks whose run_after has passed. The **reaper** claims
leases whose deadline passed on the server's clock, then fails each task with
`AcknowledgementTimeout` or retries it per its retry policy. **Recovery** claims the leases
of worker processes whose heartbeat is older than `worker_timeout` (or who have none, once
the lease is that old: a worker's first heartbeat goes out as it starts): a task that never
started goes back to ready as it was; one that was running goes back with the lost
attempt recorded (`WorkerLost`), unless it lost its worker `WORKER_LOSS_LIMIT` times in a
row. Every task of a lost lease becomes a suspect, whose next lease records its run's start
and finish on the server, so a later loss is blamed exactly; a lease without that record is
judged by the worker's last heartbeat, which may be one interval old. A claim gives the task
a new fencing token, so two brokers never handle one task and a late acknowledgement by the
original worker is refused.

Recovery runs only once this broker has reached the server without a failure for
`worker_timeout + socket_timeout`: after an outage every worker's heartbeat is stale, and
live workers need that long to send their next one. With several partitions that server is
partition 0's, which holds the heartbeats: another partition's outage leaves them fresh.

With several partitions on a cluster, a pass that cannot reach one partition's primary skips
the partitions on that node for the rest of the pass and serves the others; it raises the
first error at its end, so the caller still sees the outage (`failed_partitions` says which).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..base import UNREADABLE_PAYLOAD_ERRORS, Segment
from ..exceptions import ServerUnreachable
from ..outcome import (
    WORKER_LOSS_LIMIT,
    keeps_losing_its_worker,
    lease_expired_error,
    mark_failed,
    retry_delay,
    worker_lost_error,
)
from . import codec

if TYPE_CHECKING:
    from .redis import RedisTaskBackend

logger = logging.getLogger("threadmill.broker")

#: Seconds a reaper holds a claimed task while it decides its fate.
CLAIM_WINDOW_S = 60.0
#: Most running entries of one queue a recovery call looks through for a dead worker's leases.
RECOVERY_SCAN_LIMIT = 10_000
#: Most expired ids a trim call drops from each finished segment.
TRIM_BATCH_SIZE = 1000


class PassFailures:
    """The servers one broker pass could not reach, each with its first error.

    A duty that fails marks its partition's server failed: the pass skips that server's other
    partitions (each call there would wait out `socket_timeout` again) and serves the rest.
    """

    def __init__(self, backend: RedisTaskBackend) -> None:
        self.backend = backend
        self._errors: dict[str, Exception] = {}

    def attempt(self, partition: int, duty: Callable[..., Any], *args: Any) -> Any:
        """Return `duty(*args)`, or None when it fails or its partition's server already failed this pass."""
        server = self._server(partition)
        if server in self._errors:
            return None
        try:
            return duty(*args)
        except Exception as e:  # noqa: BLE001 - raised by raise_first once the other partitions are served
            self._errors[server] = e
            return None

    def reached(self, partition: int) -> bool:
        """Whether every call of this pass to the partition's server succeeded."""
        return self._server(partition) not in self._errors

    def raise_first(self, partitions: range) -> None:
        """Raise the first error of the pass, if any; an outage that cost only some of `partitions` names them."""
        for error in self._errors.values():
            skipped = [p for p in partitions if not self.reached(p)]
            if isinstance(error, ServerUnreachable) and len(skipped) < len(partitions):
                raise ServerUnreachable(
                    f"{error}; the pass skipped partition(s) {', '.join(map(str, skipped))} of {len(partitions)} "
                    "and served the others."
                ) from error
            raise error

    def _server(self, partition: int) -> str:
        try:
            return self.backend.scripts_for(partition).server_name()
        except Exception:  # noqa: BLE001 - no node owns the partition's slot now (a failover): its own
            return f"partition {partition}"


class RedisBroker:
    """Runs the mover and the reaper for some queues of one backend."""

    def __init__(self, backend: RedisTaskBackend, queue_names: list[str] | None = None) -> None:
        self.backend = backend
        self.queue_names = queue_names
        #: Monotonic time the next deferred task falls due, as of the last mover pass; None when none is deferred.
        self.next_due_at: float | None = None
        #: Each schedule's latest tick this broker has handed to the enqueue guard, epoch seconds.
        self._ticks_seen: dict[str, float] = {}
        #: Monotonic time since which every pass reached partition 0 (the heartbeats); None after a failure.
        self._reachable_since: float | None = None
        #: The partitions the last pass (or mover run) could not serve.
        self.failed_partitions: set[int] = set()

    def queues(self) -> list[str]:
        return self.queue_names or self.backend.queue_names()

    def run(self, stop: threading.Event) -> None:
        """Run passes every `broker_interval`, and the mover alone when a deferred task falls due, until `stop`."""
        interval = self.backend.config.broker_interval
        next_pass = 0.0
        while not stop.is_set():
            if time.monotonic() >= next_pass:
                self.run_once()
                next_pass = time.monotonic() + interval
            else:
                self.move_all()
            wake_at = next_pass if self.next_due_at is None else min(next_pass, self.next_due_at)
            stop.wait(max(0.0, wake_at - time.monotonic()))

    def run_once(self) -> tuple[int, int]:
        """Run one mover, schedules, reaper and recovery pass over every queue; return (promoted, reaped and recovered).

        Raises the first error of the pass once every partition it can reach is served.
        """
        recovering = self._trusts_heartbeats(time.monotonic())
        failures = PassFailures(self.backend)
        partitions = self._partitions(failures)
        queue_names = failures.attempt(0, self.queues) or []
        promoted = self._move_all(queue_names, partitions, failures)
        failures.attempt(0, self.run_schedules)
        heartbeats = None
        if recovering and len(partitions) > 1:
            heartbeats = failures.attempt(0, self.backend.heartbeat_ages)
        reaped = 0
        for queue_name in queue_names:
            for partition in partitions:
                # Recovery needs this pass's view of the heartbeats, on partition 0.
                recover = recovering and failures.reached(0)
                reaped += failures.attempt(partition, self._serve, queue_name, partition, recover, heartbeats) or 0
        if not failures.reached(0):
            self._reachable_since = None
        self.failed_partitions = {p for p in partitions if not failures.reached(p)}
        failures.raise_first(partitions)
        return promoted, reaped

    def _serve(self, queue_name: str, partition: int, recover: bool, heartbeats: dict[str, float] | None) -> int:
        """Sample latency, reap, recover and trim one queue in one partition; return how many were reaped."""
        self.backend.scripts_for(partition).sample_latency(queue_name)
        reaped = self.reap(queue_name, partition)
        if recover:
            reaped += self.recover(queue_name, partition, heartbeats if partition else None)
        self.trim(queue_name, partition)
        return reaped

    def _partitions(self, failures: PassFailures) -> range:
        """The covered partitions; the count last read when partition 0, which records it, cannot be reached."""
        covered = failures.attempt(0, self.backend.covered_partitions)
        return self.backend.known_partitions() if covered is None else covered

    def _trusts_heartbeats(self, now: float) -> bool:
        if self._reachable_since is None:
            self._reachable_since = now
        return now - self._reachable_since >= self.backend.config.heartbeat_settle

    def run_schedules(self, now: datetime | None = None) -> int:
        """Enqueue each schedule's latest tick at `now` (the server's clock) unless a broker did; return how many."""
        if not self.backend.schedules:
            return 0
        now = self.backend.server_time() if now is None else now
        enqueued = 0
        for schedule in self.backend.schedules:
            tick = schedule.latest_tick(now)
            # Epoch seconds: two ticks of a fall-back night's repeated hour are equal as local datetimes.
            seen = self._ticks_seen.get(schedule.name)
            if seen == tick.timestamp():
                continue
            result = self.backend.enqueue_scheduled(schedule, tick, first_offer=seen is None)
            self._ticks_seen[schedule.name] = tick.timestamp()
            if result is not None:
                logger.info("Schedule %s: enqueued task %s for %s.", schedule.name, result.id, tick.isoformat())
                enqueued += 1
        return enqueued

    def move_all(self) -> int:
        """Run the mover over every queue and note when the next deferred task falls due; return how many moved.

        Raises the first error once every partition it can reach is served.
        """
        failures = PassFailures(self.backend)
        partitions = self._partitions(failures)
        moved = self._move_all(failures.attempt(0, self.queues) or [], partitions, failures)
        self.failed_partitions = {p for p in partitions if not failures.reached(p)}
        failures.raise_first(partitions)
        return moved

    def _move_all(self, queue_names: list[str], partitions: range, failures: PassFailures) -> int:
        total, next_due_in = 0, None
        for queue_name in queue_names:
            for partition in partitions:
                moved, due_in = failures.attempt(partition, self._move, queue_name, partition) or (0, None)
                total += moved
                if due_in is not None and (next_due_in is None or due_in < next_due_in):
                    next_due_in = due_in
        # A partition that failed says nothing of its next due task: the next full pass tries it again.
        self.next_due_at = None if next_due_in is None else time.monotonic() + next_due_in
        return total

    def move(self, queue_name: str) -> int:
        """Promote every due deferred task of a queue to ready, in every partition; return how many."""
        return sum(self._move(queue_name, p)[0] for p in self.backend.covered_partitions())

    def _move(self, queue_name: str, partition: int) -> tuple[int, float | None]:
        batch_size = self.backend.config.batch_size
        scripts = self.backend.scripts_for(partition)
        total = 0
        while True:
            moved, due_in = scripts.promote(queue_name, batch_size)
            total += moved
            if moved < batch_size:
                return total, due_in

    def trim(self, queue_name: str, partition: int | None = None) -> int:
        """Drop the finished ids of a queue whose task data expired with `result_ttl`; return how many.

        `acknowledge` trims only the segment it writes to, so without this an idle queue
        would keep listing and counting tasks that are gone.
        """
        if partition is None:
            return sum(self.trim(queue_name, p) for p in self.backend.covered_partitions())
        result_ttl = self.backend.config.result_ttl
        scripts = self.backend.scripts_for(partition)
        total = 0
        while (dropped := scripts.trim_finished(queue_name, result_ttl, TRIM_BATCH_SIZE)) > 0:
            total += dropped
        return total

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
