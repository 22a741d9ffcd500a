"""Worker processes as the server records them: heartbeats and each process's last heartbeat document.

Heartbeats live in one sorted set, scored by the clock of the node that holds it; every age
is measured by that clock, never this process's. `threadmill.api.controls` and `metrics`
read them for liveness; the telemetry of `threadmill.api.workers` travels on the channel
(`backends.channel`) instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ...base import HeartbeatReading
from ..errors import translate_errors
from .host import ToolingHost


class WorkerTooling(ToolingHost):
    """Reading the heartbeats of worker processes, their ages and their documents."""

    @translate_errors
    def worker_heartbeats(self) -> dict[str, float]:
        """Return every worker process that sent a heartbeat and not its goodbye: name -> last heartbeat, epoch s."""
        return {name.decode(): score for name, score in self.client.zrange(self.keys.workers(), 0, -1, withscores=True)}

    @translate_errors
    def heartbeat_reading(self) -> HeartbeatReading:
        """Return every worker's last heartbeat with the clock and uptime of the server holding them, in one round trip.

        One pipeline on one connection: a restart in between breaks it, so the three never mix
        two lives of the server.
        """
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrangebyscore(self.keys.workers(), "-inf", "+inf", withscores=True)
        pipe.info("server")
        (seconds, micros), entries, server = pipe.execute()
        beats = {name.decode(): beat for name, beat in entries}
        return HeartbeatReading(seconds + micros / 1e6, beats, float(server.get("uptime_in_seconds", math.inf)))

    def settled_heartbeat_ages(self) -> dict[str, float]:
        """Return every worker's heartbeat age for a script on a partition above 0; 0 each while partition 0 settles.

        Right after that server restarted, the heartbeats it restored are old though live workers
        have had no time to report yet (`heartbeat_settle`): none of them is silent until then.
        """
        reading = self.heartbeat_reading()
        settling = reading.settles_in(self.config.heartbeat_settle) > 0
        return {name: 0.0 if settling else reading.now - beat for name, beat in reading.beats.items()}

    @translate_errors
    def heartbeat_ages(self) -> dict[str, float]:
        """Return every worker in the workers set with its heartbeat's age, seconds by partition 0's clock.

        Scripts on other partitions take them in ARGV: their slot does not hold the workers set.
        """
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrangebyscore(self.keys.workers(), "-inf", "+inf", withscores=True)
        (seconds, micros), entries = pipe.execute()
        now = seconds + micros / 1e6
        return {name.decode(): now - beat for name, beat in entries}

    @translate_errors
    def live_workers(self) -> list[dict[str, Any]]:
        """Return the last heartbeat document of each live worker process, with `heartbeat_age_s` added.

        Live means its heartbeat is at most `worker_timeout` old by the server's clock.
        """
        # The clock of the node holding the heartbeats, which scored them (a cluster has one per node).
        pipe = self.client_for(self.keys.workers()).pipeline(transaction=False)
        pipe.time()
        pipe.zrange(self.keys.workers(), 0, -1, withscores=True)
        (seconds, micros), entries = pipe.execute()
        now = seconds + micros / 1e6
        ages = {name.decode(): now - beat for name, beat in entries if now - beat <= self.config.worker_timeout}
        if not ages:
            return []
        documents = self.client.mget([self.keys.worker(name) for name in ages])
        return [
            {**json.loads(raw), "worker": name, "heartbeat_age_s": round(age, 3)}
            for (name, age), raw in zip(ages.items(), documents, strict=True)
            if raw is not None
        ]

    @translate_errors
    def worker_document(self, name: str) -> dict | None:
        """Return a worker's last heartbeat document, or None once it expired or the worker said goodbye."""
        raw = self.client.get(self.keys.worker(name))
        return None if raw is None else json.loads(raw)
