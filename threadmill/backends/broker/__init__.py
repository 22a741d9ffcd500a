"""`RedisBroker`: the maintenance a worker supervisor runs beside its workers, as a list of duties.

Each duty is a `Duty` subclass in a module of this package, with one `run_once(pass_)` and its
own `interval()`; `DUTIES` lists them in the order a pass runs them:

- `mover`: promotes due deferred tasks (and runs alone when the next one falls due);
- `scheduler`: enqueues each schedule's latest tick;
- `latency`: samples each queue's oldest ready task's age;
- `reaper`: fails or retries tasks whose lease expired;
- `recovery`: takes back the leases of lost worker processes;
- `trimmer`: drops finished ids whose task data expired;
- `sweeper`: settles the final parents of waiting workflow tasks no acknowledgement settled;
- `recounter`: counts in their workflows' records the final outcomes an older release left uncounted;
- `full-trimmer`: drops the oldest successful tasks (leaving tombstones) while the server is over its maxmemory.

Adding a duty is one module with a `Duty` subclass
plus its entry in `DUTIES`; the broker walks the registry, it names no duty in its pass. A
duty makes every server call through `BrokerPass.attempt`, so a pass that cannot reach a
server skips that server's partitions for every later duty and raises at its end (`passes`).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from .full_trimmer import FullTrimmer
from .latency import Latency
from .mover import Mover
from .passes import BrokerPass, Duty, PassFailures
from .reaper import Reaper
from .recounter import Recounter
from .recovery import Recovery
from .scheduler import Scheduler
from .sweeper import Sweeper
from .trimmer import Trimmer

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

__all__ = ["DUTIES", "BrokerPass", "Duty", "PassFailures", "RedisBroker"]

#: The broker's duties, in the order each pass runs them.
DUTIES: tuple[type[Duty], ...] = (Mover, Scheduler, Latency, Reaper, Recovery, Trimmer, Sweeper, Recounter, FullTrimmer)

D = TypeVar("D", bound=Duty)


class RedisBroker:
    """Runs the duties in `DUTIES` for some queues of one backend."""

    def __init__(self, backend: RedisTaskBackend, queue_names: list[str] | None = None) -> None:
        self.backend = backend
        self.queue_names = queue_names
        self.duties = [duty(backend) for duty in DUTIES]
        #: Each duty's next due moment, monotonic seconds, as of its last run (or of the start, `runs_at_start`).
        started = time.monotonic()
        self._due_at: dict[str, float] = {d.name: started + d.interval() for d in self.duties if not d.runs_at_start}
        #: Monotonic time since which every pass reached partition 0 (the heartbeats); None after a failure.
        self._reachable_since: float | None = None
        #: The partitions the last pass (or mover run) could not serve.
        self.failed_partitions: set[int] = set()

    @property
    def next_due_at(self) -> float | None:
        """Monotonic time the next deferred task falls due, as of the last mover run; None when none is deferred."""
        return self._duty(Mover).next_due_at

    @property
    def _ticks_seen(self) -> dict[str, float]:
        return self._duty(Scheduler).ticks_seen

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

    def run_once(self, *, due_only: bool = False) -> tuple[int, int]:
        """Run one pass of every duty over every queue; return (promoted, reaped and recovered).

        `due_only` leaves out each duty whose `interval()` has not passed since its last run.
        Raises the first error of the pass once every partition it can reach is served.
        """
        now = time.monotonic()
        pass_ = self._open(trusts_heartbeats=self._trusts_heartbeats(now))
        handled: dict[str, int] = {}
        for duty in self.duties:
            if due_only and now < self._due_at.get(duty.name, now):
                continue
            self._due_at[duty.name] = now + duty.interval()
            handled[duty.name] = duty.run_once(pass_)
        if not pass_.reached(0):
            self._reachable_since = None
        self._close(pass_)
        return handled.get(Mover.name, 0), handled.get(Reaper.name, 0) + handled.get(Recovery.name, 0)

    def move_all(self) -> int:
        """Run the mover over every queue and note when the next deferred task falls due; return how many moved.

        Raises the first error once every partition it can reach is served.
        """
        pass_ = self._open()
        moved = self._duty(Mover).run_once(pass_)
        self._close(pass_)
        return moved

    def _open(self, trusts_heartbeats: bool = False) -> BrokerPass:
        """Start a pass: read the covered partitions and the queues, on partition 0."""
        failures = PassFailures(self.backend)
        covered = failures.attempt(0, self.backend.covered_partitions)
        # The count last read when partition 0, which records it, cannot be reached.
        partitions = self.backend.known_partitions() if covered is None else covered
        queue_names = failures.attempt(0, self.queues) or []
        return BrokerPass(queue_names, partitions, failures, trusts_heartbeats)

    def _close(self, pass_: BrokerPass) -> None:
        self.failed_partitions = {p for p in pass_.partitions if not pass_.reached(p)}
        pass_.failures.raise_first(pass_.partitions)

    def _trusts_heartbeats(self, now: float) -> bool:
        """Whether partition 0 was reached for `heartbeat_settle`, so an old heartbeat means a gone worker."""
        if self._reachable_since is None:
            self._reachable_since = now
        return now - self._reachable_since >= self.backend.config.heartbeat_settle

    def _duty(self, kind: type[D]) -> D:
        for duty in self.duties:
            if isinstance(duty, kind):
                return duty
        raise LookupError(f"This broker has no {kind.name} duty: it is not in DUTIES.")

    def run_schedules(self, now: datetime | None = None) -> int:
        """Enqueue each schedule's latest tick at `now` (the server's clock) unless a broker did; return how many."""
        return self._duty(Scheduler).run_schedules(now)

    def move(self, queue_name: str) -> int:
        """Promote every due deferred task of a queue to ready, in every partition; return how many."""
        return self._duty(Mover).move(queue_name)

    def trim(self, queue_name: str, partition: int | None = None) -> int:
        """Drop the finished ids of a queue whose task data expired with `result_ttl`; return how many."""
        return self._duty(Trimmer).trim(queue_name, partition)

    def reap(self, queue_name: str, partition: int | None = None) -> int:
        """Fail or retry every task of a queue whose lease expired (in one partition, or all); return how many."""
        return self._duty(Reaper).reap(queue_name, partition)

    def recover(self, queue_name: str, partition: int | None = None, heartbeats: dict[str, float] | None = None) -> int:
        """Take back every lease of a queue held by a worker whose heartbeat stopped, or never came; return how many."""
        return self._duty(Recovery).recover(queue_name, partition, heartbeats)
