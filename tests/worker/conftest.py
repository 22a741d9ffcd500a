"""Helpers that run `manage.py threadmill worker` as a real process against the session's server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.tasks import task_backends

from threadmill.base import Segment

ROOT = Path(__file__).resolve().parents[2]
#: Longest a worker test waits for a condition or a process, seconds.
DEADLINE_S = 60.0


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the worker command to completion (it must exit by itself) and return it."""
    return subprocess.run(
        [sys.executable, "manage.py", "threadmill", "worker", *args],
        cwd=ROOT,
        env=env or worker_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


class Worker:
    """A worker pool started in the background; its stderr goes to a file the test can read."""

    #: What the worker command runs under (a subclass may start it in namespaces of its own).
    COMMAND_PREFIX: tuple[str, ...] = ()

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", prefix="threadmill-worker-", suffix=".log")  # noqa: SIM115 - closed by close()
        self.process = subprocess.Popen(
            [*self.COMMAND_PREFIX, sys.executable, "manage.py", "threadmill", "worker", *args],
            cwd=ROOT,
            env=env or worker_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    @property
    def output(self) -> str:
        return Path(self.log.name).read_text()

    def records(self) -> list[dict]:
        """The JSON log records written so far."""
        return [json.loads(line) for line in self.output.splitlines() if line.startswith("{")]

    def children(self) -> list[int]:
        """Pids of the worker processes running now."""
        import psutil

        try:
            return [child.pid for child in psutil.Process(self.process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` and return the exit code once the pool exits."""
        self.process.send_signal(signum)
        return self.process.wait(DEADLINE_S)

    def close(self) -> None:
        # Listed first: once the supervisor is gone its children are no longer its children.
        children = self.children()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture
def start_worker():
    """Start worker pools in the background; any still running at the end are killed."""
    workers: list[Worker] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Worker:
        workers.append(Worker(*args, env=env))
        return workers[-1]

    yield start
    for worker in workers:
        worker.close()


def wait_until(predicate: Callable[[], object], message: str, timeout: float = DEADLINE_S):
    """Poll `predicate` until it returns something truthy, and return it; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"Timed out after {timeout:g} s waiting until {message}.")


@pytest.fixture
def backend():
    return task_backends["default"]


def segment_counts(backend, queue_name: str = "default") -> dict[Segment, int]:
    return backend.queue_stats().get(queue_name, dict.fromkeys(Segment, 0))
