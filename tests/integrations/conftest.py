"""An in-process worker against the session's server: the tools under test see its spans and events here."""

from __future__ import annotations

import pytest

from tests.worker.conftest import wait_until
from threadmill.backends.broker import RedisBroker
from threadmill.backends.redis import RedisTaskBackend
from threadmill.worker.config import WorkerConfig
from threadmill.worker.process import WorkerProcess


@pytest.fixture
def backend(redis_url) -> RedisTaskBackend:
    return RedisTaskBackend("default", {"REDIS_URL": redis_url, "OPTIONS": {"poll_interval": 0.005}})


def drain(backend: RedisTaskBackend) -> WorkerProcess:
    """Run a worker process in this process until its queue is empty, and return it."""
    process = WorkerProcess(backend, WorkerConfig(queues=("default",), threads=1, exit_empty=True), "h:1:integrations")
    process.start()
    assert process.finished.wait(30), "the worker did not drain the queue"
    return process


def drain_with_retries(backend: RedisTaskBackend, attempts: int) -> None:
    """Drain `attempts` times, promoting the retried (deferred) tasks in between as the broker would."""
    broker = RedisBroker(backend, ["default"])
    drain(backend)
    for _ in range(attempts - 1):
        wait_until(lambda: broker.move("default"), "the retry is due and promoted", timeout=10)
        drain(backend)
