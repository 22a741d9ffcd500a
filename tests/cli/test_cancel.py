"""`manage.py threadmill cancel ID...`: a line per id, exit 0 only when every id was cancelled or asked to abort."""

from __future__ import annotations

from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.backends.conftest import finish
from tests.cli.test_status import threadmill


def test_cancel_prints_a_line_per_id_and_exits_0_when_every_one_was_taken():
    backend = task_backends["default"]
    tasks.echo.enqueue(0)
    [running] = backend.acquire("default")
    ready = tasks.echo.enqueue(1)

    done = threadmill("cancel", ready.id, running.id)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"{ready.id}: cancelled; it will not run.",
        f"{running.id}: running; its worker was asked to abort it.",
    ]
    error = backend.get_result(ready.id).errors[0]
    assert backend.get_result(ready.id).status == TaskResultStatus.FAILED
    assert "(command line) at " in error.traceback


def test_cancel_of_a_finished_or_unknown_id_says_so_and_exits_1_without_a_traceback():
    backend = task_backends["default"]
    tasks.echo.enqueue(0)
    [leased] = backend.acquire("default")
    finish(backend, leased, 3)
    ready = tasks.echo.enqueue(1)

    done = threadmill("cancel", leased.id, "no-such-id", ready.id)

    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{leased.id}: already finished; nothing changed.",
        "no-such-id: no such task.",
        f"{ready.id}: cancelled; it will not run.",
    ]
    assert "Traceback" not in done.stderr
    assert backend.get_result(leased.id).status == TaskResultStatus.SUCCESSFUL
