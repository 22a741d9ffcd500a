"""An idle worker that a concurrency limit held back starts the next task as soon as a slot frees."""

from __future__ import annotations

from datetime import timedelta

from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import wait_until

#: Well under the idle wait (fetcher.IDLE_WAIT_S, 5 s): a woken worker starts the task in milliseconds.
PROMPTLY_S = 2.0


def _blocked_on_a_wake_list(backend) -> bool:
    return any(c.get("cmd") == "blpop" and "b" in c.get("flags", "") for c in backend.client.client_list())


def test_a_retry_with_a_delay_wakes_a_worker_waiting_on_its_queue_at_the_concurrency_limit(backend, start_worker):
    backend.set_limit("default", concurrency=1, by="test")
    tasks.echo.enqueue("first")
    [first] = backend.acquire("default", count=1, worker="another:1")
    waiting = tasks.echo.enqueue("second")
    start_worker("-w", "1", "-t", "2", "-q", "default")
    wait_until(lambda: _blocked_on_a_wake_list(backend), "the worker waits on the wake list, held back")

    # The other worker's run failed and retries in a minute: its slot is free now.
    assert backend.requeue(first, run_after=timedelta(minutes=1))

    wait_until(
        lambda: backend.get_result(waiting.id).status != TaskResultStatus.READY,
        "the waiting task started",
        timeout=PROMPTLY_S,
    )
