"""`manage.py threadmill limit` and how `status` shows a throttled queue, as real commands."""

from __future__ import annotations

import re

import pytest
from django.tasks import task_backends

from tests import tasks
from tests.cli.test_status import _queue, _status, threadmill
from threadmill.limits import parse_rate


def _serve(queue_name: str = "default") -> None:
    """A live worker's heartbeat for the queue, so it is not unserved."""
    task_backends["default"].heartbeat(
        "box:42:qmzkfhre", {"type": "worker", "state": "running", "queues": [queue_name]}
    )


def test_limit_sets_shows_and_clears_a_queue_s_runtime_limits():
    done = threadmill("limit", "emails", "--concurrency", "5", "--rate", "100/m")
    assert done.returncode == 0, done.stderr
    assert "Queue 'emails' is limited to 5 running at once, 100/m until cleared." in done.stdout

    assert "limited to 2 running at once, 100/m" in threadmill("limit", "emails", "--concurrency", "2").stdout
    shown = threadmill("limit", "emails").stdout
    assert "Queue 'emails': 2 running at once, 100/m (set by " in shown and "(command line)" in shown
    assert _queue(_status()[1], "emails")["limits"] == {"concurrency": 2, "rate": "100/m"}

    cleared = threadmill("limit", "emails", "--clear").stdout
    assert "Cleared the runtime limits of queue 'emails'; in force now: no limits." in cleared
    assert _queue(_status()[1], "emails")["limits"] == {"concurrency": None, "rate": None}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["emails", "--rate", "5/x"], "A rate is N/s, N/m or N/h with N a whole number, not '5/x'."),
        (["emails", "--concurrency", "-3"], "A concurrency limit is a whole number of at least 1, not -3."),
        (["emails", "--concurrency", "many"], "A concurrency limit is a whole number of at least 1, not 'many'."),
        (["emails", "--concurrency", "²"], "A concurrency limit is a whole number of at least 1, not '²'."),
        (
            ["emails", "--rate", f"{'9' * 5000}/s"],
            f"A rate is N/s, N/m or N/h with N a whole number, not '{'9' * 5000}/s'.",
        ),
        (["nosuch", "--concurrency", "3"], "Unknown queue 'nosuch'; backend 'default' has default, emails, reports."),
        (["emails", "--clear", "--rate", "1/s"], "--clear takes no --concurrency or --rate."),
    ],
)
def test_bad_limit_input_is_a_one_line_error_naming_the_problem(args, message):
    done = threadmill("limit", *args)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"CommandError: {message}"]


def _status_after_leasing(task) -> tuple[int, dict]:
    """Enqueue five runs of `task`, lease all a live worker may, and return `status --json`'s exit code and output."""
    backend = task_backends["default"]
    for i in range(5):
        task.enqueue(i)
    while backend.acquire("default", count=5, worker="box:42:qmzkfhre"):
        pass
    _serve()
    return _status()


def test_a_queue_at_its_concurrency_limit_is_throttled_not_stuck():
    task_backends["default"].set_limit("default", concurrency=3)

    code, status = _status_after_leasing(tasks.echo)

    assert code == 0
    default = _queue(status, "default")
    assert (default["throttled"], default["limits"], default["unserved"]) == (
        True,
        {"concurrency": 3, "rate": None},
        False,
    )
    assert "throttled: 3/3 running" in threadmill("status").stdout
    assert _queue(status, "emails")["throttled"] is False


def test_a_queue_out_of_rate_tokens_says_when_the_next_one_comes():
    task_backends["default"].set_limit("default", rate=parse_rate("3/h"))

    code, status = _status_after_leasing(tasks.echo)

    assert code == 0 and _queue(status, "default")["throttled"] is True
    assert re.search(r"rate limited, next in 35\d\d\.\d s", threadmill("status").stdout)


def test_a_queue_whose_tasks_a_per_task_limit_holds_says_which_and_is_not_stuck():
    code, status = _status_after_leasing(tasks.three_at_a_time)

    assert code == 0
    default = _queue(status, "default")
    assert (default["throttled"], default["held_by_task_limits"], default["unserved"]) == (
        True,
        ["tests.tasks.three_at_a_time"],
        False,
    )
    assert "held by per-task limits: tests.tasks.three_at_a_time (3/3 running)" in threadmill("status").stdout
    assert _queue(status, "emails")["held_by_task_limits"] == []
