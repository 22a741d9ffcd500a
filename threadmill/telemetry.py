"""Worker telemetry: each worker process publishes a snapshot of itself on the backend's channel.

A snapshot is one JSON object (the README's "Worker telemetry" documents each field),
published every `SNAPSHOT_INTERVAL_S` while the process runs and once more, with
`"state": "stopped"`, when it exits. Publishing never stops the worker: a failure is
logged once and the next snapshot tries again.
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

import psutil

if TYPE_CHECKING:
    from .worker.process import WorkerProcess

logger = logging.getLogger("threadmill.telemetry")

#: Seconds between two snapshots of a worker process.
SNAPSHOT_INTERVAL_S = 2.0
#: Seconds of history the tasks-per-minute rate is measured over.
RATE_WINDOW_S = 60.0


class TelemetryPublisher:
    """Publishes snapshots of one worker process until it finishes."""

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        self.channel = process.backend.keys.telemetry()
        self.started_at = time.time()
        self._psutil = psutil.Process()
        self._psutil.cpu_percent(None)
        self._samples: deque[tuple[float, int]] = deque()
        self._failing = False

    def run(self) -> None:
        """Publish a running snapshot at once, then every interval until the process finishes."""
        # The first snapshot goes out at start, so the console never shows a fresh worker as missing.
        self.publish("running")
        while not self.process.finished.wait(SNAPSHOT_INTERVAL_S):
            self.publish("running")

    def start(self) -> threading.Thread:
        """Run the publisher on a daemon thread and return it."""
        thread = threading.Thread(target=self.run, name="telemetry", daemon=True)
        thread.start()
        return thread

    def publish(self, state: str) -> None:
        """Publish one snapshot with `state` ("running" or "stopped")."""
        try:
            self.process.backend.client.publish(self.channel, json.dumps(self.snapshot(state)))
        except Exception as e:  # noqa: BLE001 - telemetry must never stop the worker
            if not self._failing:
                logger.warning("Publishing worker telemetry failed: %s", e)
            self._failing = True
        else:
            self._failing = False

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
            "buffer_fill": len(process.buffer),
            "buffer_size": process.size,
            "tasks_done": process.done,
            "tasks_per_minute": round(self._rate(now, process.done), 1),
            "cpu_percent": self._psutil.cpu_percent(None),
            "rss_bytes": self._psutil.memory_info().rss,
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
