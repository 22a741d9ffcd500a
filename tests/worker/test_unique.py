"""A worker finishing a unique task releases its key, so the next enqueue of the same call is a new task."""

from __future__ import annotations

from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import run_worker


def test_a_worker_finishing_a_unique_task_lets_the_same_call_in_again(backend):
    first = tasks.unique_echo.enqueue("a")
    assert tasks.unique_echo.enqueue("a").duplicate

    done = run_worker("-w", "1", "--exit-empty")

    assert done.returncode == 0, done.stderr
    assert backend.get_result(first.id).status == TaskResultStatus.SUCCESSFUL
    assert backend.client.exists(first.unique_key) == 0
    again = tasks.unique_echo.enqueue("a")
    assert not again.duplicate and again.id != first.id
