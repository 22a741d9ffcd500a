"""`RedisBroker`: the maintenance a worker supervisor runs beside its workers.

Its duties each live in a module of this package: the mover (`mover`), the reaper
(`reaper`), recovery (`recovery`), trimming (`trimmer`), schedules (`scheduler`) and latency
sampling (`latency`). What a pass does when a server is down is in `passes`.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING

from .latency import Latency
from .mover import Mover
from .passes import PassFailures
from .reaper import Reaper
from .recovery import Recovery
from .scheduler import Scheduler
from .trimmer import Trimmer

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

__all__ = ["PassFailures", "RedisBroker"]


class RedisBroker:
    """Runs the mover and the reaper for some queues of one backend."""

    def __init__(self, backend: RedisTaskBackend, queue_names: list[str] | None = None) -> None:
        self.backend = backend
        self.queue_names = queue_names
        self._mover = Mover(backend)
        self._scheduler = Scheduler(backend)
        self._latency = Latency(backend)
        self._reaper = Reaper(backend)
        self._recovery = Recovery(backend)
        self._trimmer = Trimmer(backend)
        #: Each schedule's latest tick this broker has handed to the enqueue guard, epoch seconds.
        self._ticks_seen = self._scheduler.ticks_seen
        #: Monotonic time since which every pass reached partition 0 (the heartbeats); None after a failure.
        self._reachable_since: float | None = None
        #: The partitions the last pass (or mover run) could not serve.
        self.failed_partitions: set[int] = set()

    @property
    def next_due_at(self) -> float | None:
        """Monotonic time the next deferred task falls due, as of the last mover run; None when none is deferred."""
        return self._mover.next_due_at

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
        promoted = self._mover.move_all(queue_names, partitions, failures)
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
        self._latency.sample(queue_name, partition)
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
        return self._scheduler.run_schedules(now)

    def move_all(self) -> int:
        """Run the mover over every queue and note when the next deferred task falls due; return how many moved.

        Raises the first error once every partition it can reach is served.
        """
        failures = PassFailures(self.backend)
        partitions = self._partitions(failures)
        moved = self._mover.move_all(failures.attempt(0, self.queues) or [], partitions, failures)
        self.failed_partitions = {p for p in partitions if not failures.reached(p)}
        failures.raise_first(partitions)
        return moved

    def move(self, queue_name: str) -> int:
        """Promote every due deferred task of a queue to ready, in every partition; return how many."""
        return self._mover.move(queue_name)

    def trim(self, queue_name: str, partition: int | None = None) -> int:
        """Drop the finished ids of a queue whose task data expired with `result_ttl`; return how many."""
        return self._trimmer.trim(queue_name, partition)

    def reap(self, queue_name: str, partition: int | None = None) -> int:
        """Fail or retry every task of a queue whose lease expired (in one partition, or all); return how many."""
        return self._reaper.reap(queue_name, partition)

    def recover(self, queue_name: str, partition: int | None = None, heartbeats: dict[str, float] | None = None) -> int:
        """Take back every lease of a queue held by a worker whose heartbeat stopped, or never came; return how many."""
        return self._recovery.recover(queue_name, partition, heartbeats)
