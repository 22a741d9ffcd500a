"""Heartbeat trust: whether a worker process may still take its buffered leases for its own.

The heartbeat is sent by the telemetry thread, which reports each one the server stored
(`heartbeat_confirmed`). A process that saw no stored heartbeat for `HEARTBEAT_TRUST_SHARE` of
`worker_timeout` (it was frozen, starved or cut off) may have had its leases recovered by the
broker: it starts nothing buffered on trust and fetches nothing until a heartbeat is stored
again, and hands everything it buffered before the gap back (fenced by lease token, so a task
the broker already took is left alone). Only a task that was running at the freeze may run
again; its late acknowledgement is refused.

Each buffered task carries the trust epoch it was leased in; a gap bumps the epoch, so a task
leased before it is handed back, never run.
"""

from __future__ import annotations

import logging
import time

from .host import ProcessHost
from .state import Buffered

logger = logging.getLogger("threadmill.worker")

#: Share of `worker_timeout` a heartbeat gap may reach before buffered leases are no longer
#: trusted. The broker recovers a worker silent for the whole timeout; half leaves room for a
#: slow heartbeat call and the two clocks, and is still twice the heartbeat interval.
HEARTBEAT_TRUST_SHARE = 0.5


class HeartbeatTrust(ProcessHost):
    """Mixed into `WorkerProcess`: distrusts its buffer after a heartbeat gap.

    Uses the process's `heartbeat_confirmed_at`, `trust_epoch`, `trust_s`, `buffer`,
    `unstarted`, its lock and `_has_work`.
    """

    def _distrust_buffer(self, entry: Buffered | None, now: float) -> None:
        """Hand back `entry` and everything buffered (the lock held); the fenced release skips recovered ones."""
        handed_back = [entry.result] if entry is not None else []
        handed_back.extend(e.result for e in self.buffer)
        self.buffer.clear()
        if handed_back:
            logger.warning(
                "No heartbeat of worker process %s was confirmed for %.1f s: %d buffered tasks go back "
                "unstarted (the broker may have recovered them).",
                self.name,
                now - self.heartbeat_confirmed_at,
                len(handed_back),
            )
            self.unstarted.extend(handed_back)
            self._has_work.notify()

    def heartbeat_confirmed(self, sent_at: float) -> None:
        """Record that the server stored a heartbeat sent at monotonic `sent_at`; a long gap distrusts the buffer."""
        with self._lock:
            now = time.monotonic()
            if now - self.heartbeat_confirmed_at > self.trust_s:
                self.trust_epoch += 1
                self._distrust_buffer(None, now)
            self.heartbeat_confirmed_at = max(self.heartbeat_confirmed_at, sent_at)
            self._has_work.notify()
