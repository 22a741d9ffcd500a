"""The scheduler: enqueues each schedule's latest tick, once across every broker.

Ticks are read on the server's clock; the enqueue guard on the server makes one broker's
offer win (`RedisTaskBackend.enqueue_scheduled`). After an outage only the latest missed
tick is offered. Each broker remembers the ticks it offered, so it asks once per tick.
A full server refuses a tick's enqueue (`ServerOutOfMemory`): that is logged once per tick
and offered again next pass, and is not the pass's failure, so the reaper, recovery and
trimmer after it still run on that server, draining and freeing it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from ...exceptions import ServerOutOfMemory
from .passes import BrokerPass, Duty

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend

logger = logging.getLogger("threadmill.broker")


class Scheduler(Duty):
    """Offers each schedule's latest tick to the enqueue guard."""

    name = "scheduler"

    def __init__(self, backend: RedisTaskBackend) -> None:
        super().__init__(backend)
        #: Each schedule's latest tick this broker has handed to the enqueue guard, epoch seconds.
        self.ticks_seen: dict[str, float] = {}
        #: Each schedule's latest tick a full server refused, epoch seconds (logged once).
        self.ticks_refused: dict[str, float] = {}

    def run_once(self, pass_: BrokerPass) -> int:
        """Offer every schedule's latest tick, on partition 0 (which holds the schedules); return how many it enqueued."""
        return pass_.attempt(0, self.run_schedules) or 0

    def run_schedules(self, now: datetime | None = None) -> int:
        """Enqueue each schedule's latest tick at `now` (the server's clock) unless a broker did; return how many."""
        if not self.backend.schedules:
            return 0
        now = self.backend.server_time() if now is None else now
        enqueued = 0
        for schedule in self.backend.schedules:
            tick = schedule.latest_tick(now)
            # Epoch seconds: two ticks of a fall-back night's repeated hour are equal as local datetimes.
            seen = self.ticks_seen.get(schedule.name)
            if seen == tick.timestamp():
                continue
            try:
                result = self.backend.enqueue_scheduled(schedule, tick, first_offer=seen is None)
            except ServerOutOfMemory as e:
                self.refused(schedule.name, tick, e)
                continue
            self.ticks_seen[schedule.name] = tick.timestamp()
            if result is not None:
                logger.info("Schedule %s: enqueued task %s for %s.", schedule.name, result.id, tick.isoformat())
                enqueued += 1
        return enqueued

    def refused(self, name: str, tick: datetime, error: ServerOutOfMemory) -> None:
        """Log, once per tick, that a full server refused schedule `name`'s tick; it is offered again next pass."""
        if self.ticks_refused.get(name) != tick.timestamp():
            self.ticks_refused[name] = tick.timestamp()
            logger.warning("Schedule %s: the tick of %s waits for room: %s", name, tick.isoformat(), error)
