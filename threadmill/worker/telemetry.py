"""Worker telemetry and heartbeats: each worker process reports itself to the server.

A snapshot is one JSON object (docs/explanation/worker.md, "Telemetry", documents each field).
It is sent as the process's **heartbeat** every `heartbeat_interval(options)` while the process runs:
one script call stores it with the server's time in the workers set (durable: the broker
recovers the leases of a worker whose heartbeat grows older than `worker_timeout`) and
publishes it on the telemetry channel (live: the console). The heartbeat runs on a thread of
its own, so a busy task cannot starve it; the first goes out from the fetcher, on its connection,
right after its first acquire. When the process exits it publishes a last snapshot
with `"state": "stopped"` and, if no lease on the server names it any more, says goodbye (leaves
the workers set). Each stored heartbeat is reported to the process, which stops trusting its
buffered leases after a long gap (`WorkerProcess.heartbeat_confirmed`). Sending never stops the
worker: a failure is logged once and the next beat tries again.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..redaction import redact_text
from .usage import ProcessUsage

if TYPE_CHECKING:
    from .process import WorkerProcess

logger = logging.getLogger("threadmill.telemetry")

#: Longest time between two heartbeats (and snapshots) of a worker process, seconds.
SNAPSHOT_INTERVAL_S = 2.0
#: Seconds of history the tasks-per-minute rate is measured over.
RATE_WINDOW_S = 60.0


#: The snapshot's `state` for each worker phase; any other phase reads "running".
PHASE_STATES = {"quiet": "quiet", "stopping": "stopping", "stopped": "stopped"}


def heartbeat_interval(worker_timeout_s: float) -> float:
    """Return the seconds between two heartbeats: often enough that three in a row may be lost in `worker_timeout`."""
    return min(SNAPSHOT_INTERVAL_S, worker_timeout_s / 4)


class TelemetryPublisher:
    """Publishes snapshots of one worker process until it finishes."""

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        self.channel = process.backend.keys.telemetry()
        self.started_at = time.time()
        self._usage = ProcessUsage()
        self._samples: deque[tuple[float, int]] = deque()
        self._failing = False
        self._thread: threading.Thread | None = None
        process.first_heartbeat = self.beat

    def run(self) -> None:
        """Send a heartbeat every interval until the process finishes, the first unless the fetcher sent it."""
        # The fetcher sends the first as the process starts (`Fetcher._announce`), so the console never
        # shows a fresh worker as missing; should it not within an interval, this thread does.
        interval = heartbeat_interval(self.process.backend.config.worker_timeout)
        if not self.process.announced.wait(interval):
            self.beat()
        while not self.process.finished.wait(interval):
            self.beat()

    def start(self) -> threading.Thread:
        """Run the heartbeat on a daemon thread and return it."""
        thread = threading.Thread(target=self.run, name="heartbeat", daemon=True)
        thread.start()
        self._thread = thread
        return thread

    def beat(self) -> None:
        """Store and publish a running snapshot as this process's heartbeat; tell the process once it is stored."""
        process = self.process
        state = PHASE_STATES.get(process.phase.value, "running")
        sent_at = time.monotonic()
        if self._send(lambda: process.backend.heartbeat(process.name, self.snapshot(state))):
            process.heartbeat_confirmed(sent_at)

    def goodbye(self) -> None:
        """Publish the stopped snapshot; leave the workers set only when no lease on the server names this process.

        Otherwise the heartbeat is left to age, so the broker recovers what is left.
        """
        backend, process = self.process.backend, self.process
        if self._thread is not None:
            # A beat still on the wire (the first goes out as the process starts, and a process
            # with nothing to do ends within milliseconds) would land after the goodbye and keep
            # the process in the workers set until it aged out. The thread ends once `finished`
            # is set, after that beat; a beat on a hung server gives up after one socket timeout.
            self._thread.join(backend.config.socket_timeout + 1)
        self._send(lambda: backend.publish_telemetry(json.dumps(self.snapshot("stopped"))))
        if process.named_on_server:
            logger.warning(
                "Worker process %s leaves leases on the server; its heartbeat ages and the broker recovers them.",
                process.name,
            )
        else:
            self._send(lambda: backend.heartbeat(process.name, None))

    def _send(self, call) -> bool:
        """Make `call`; return whether it succeeded (a failure is logged once in a row)."""
        try:
            call()
        except Exception as e:  # noqa: BLE001 - telemetry must never stop the worker
            if not self._failing:
                logger.warning("Sending worker telemetry failed: %s", redact_text(str(e)))
            self._failing = True
            return False
        self._failing = False
        return True

    def snapshot(self, state: str) -> dict[str, Any]:
        """Return this process's snapshot as a JSON-ready dict."""
        process, config = self.process, self.process.config
        now = time.time()
        return {
            "type": "worker",
            "state": state,
            "worker": process.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "backend": config.backend,
            "queues": list(config.queues),
            "threads": config.threads,
            "busy_threads": process.busy,
            "running": [result.id for result in list(process.running.values())],
            "buffered": [entry.result.id for entry in list(process.buffer)],
            "buffer_fill": len(process.buffer),
            "buffer_size": process.size,
            "prefetch": "auto" if process.prefetch.auto else process.prefetch.count,
            "task_run_seconds": process.prefetch.run_s,
            "tasks_done": process.done,
            "tasks_per_minute": round(self._rate(now, process.done), 1),
            "cpu_percent": self._usage.cpu_percent(),
            "rss_bytes": self._usage.rss_bytes(),
            "started_at": self.started_at,
            "time": now,
        }

    def _rate(self, now: float, done: int) -> float:
        samples = self._samples
        samples.append((now, done))
        while len(samples) > 1 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        since, done_then = samples[0] if len(samples) > 1 else (self.started_at, 0)
        elapsed = now - since
        return 60.0 * (done - done_then) / elapsed if elapsed > 0 else 0.0
