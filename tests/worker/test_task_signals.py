"""Django's task signals around a run: sent unless only Django's own log receiver, silenced, would get them."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
from django.dispatch.dispatcher import Signal
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished, task_started

from tests import tasks
from tests.calls import count_calls
from threadmill.backends.redis import RedisTaskBackend
from threadmill.worker.executor import Executor

# A run calls Django's close_old_connections, which touches a connection an earlier test in this
# process left open; transactional access lets it, without wrapping the run in a transaction.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def leased(backend):
    """Return a function that enqueues `task` and leases it, as a worker's fetcher does."""

    def lease(task, *args):
        task.enqueue(*args)
        (result,) = backend.acquire("default", count=1, worker="w-signals")
        return result

    return lease


@contextmanager
def django_tasks_level(level: int):
    logger = logging.getLogger("django.tasks")
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def signal_sends(run) -> int:
    """Run `run()` and return how many times a Django signal was sent on this thread meanwhile."""
    return count_calls(Signal.send.__code__, run)


def test_a_plain_run_sends_no_signal_when_only_djangos_silenced_log_receiver_would_get_it(leased):
    result = leased(tasks.echo, 1)
    executor = Executor(RedisTaskBackend, watchdog=None)
    with django_tasks_level(logging.WARNING):
        sends = signal_sends(lambda: executor.run(result))

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert sends == 0


def test_djangos_start_and_finish_lines_are_logged_once_their_level_is_on(leased, caplog):
    result = leased(tasks.echo, 1)
    with caplog.at_level(logging.INFO), django_tasks_level(logging.INFO):
        Executor(RedisTaskBackend, watchdog=None).run(result)

    lines = [r.getMessage() for r in caplog.records if r.name == "django.tasks"]
    assert lines == [
        f"Task id={result.id} path=tests.tasks.echo state=RUNNING",
        f"Task id={result.id} path=tests.tasks.echo state=SUCCESSFUL",
    ]


def test_a_failure_is_logged_at_error_while_info_is_off(leased, caplog):
    result = leased(tasks.explode)
    with caplog.at_level(logging.INFO), django_tasks_level(logging.WARNING):
        Executor(RedisTaskBackend, watchdog=None).run(result)

    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "django.tasks"] == [
        (logging.ERROR, f"Task id={result.id} path=tests.tasks.explode state=FAILED")
    ]


def test_a_receiver_connected_at_run_time_gets_every_start_and_finish_until_disconnected(leased):
    heard = []

    def receiver(sender, task_result, signal, **kwargs):
        heard.append((signal is task_started, task_result.status))

    executor = Executor(RedisTaskBackend, watchdog=None)
    with django_tasks_level(logging.WARNING):
        executor.run(leased(tasks.echo, 1))
        task_started.connect(receiver)
        task_finished.connect(receiver)
        try:
            executor.run(leased(tasks.echo, 2))
        finally:
            task_started.disconnect(receiver)
            task_finished.disconnect(receiver)
        executor.run(leased(tasks.echo, 3))

    assert heard == [(True, TaskResultStatus.RUNNING), (False, TaskResultStatus.SUCCESSFUL)]
