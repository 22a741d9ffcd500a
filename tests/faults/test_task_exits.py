"""Task code that raises BaseException: `sys.exit()`, `exit()`, KeyboardInterrupt, in sync and async tasks.

Each is the task's outcome like any other failure (class path and traceback recorded, the
retry policy decides); the consumer thread and the process live on, and nothing is left
RUNNING. Every start is counted on the counter server.
"""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.faults.conftest import Tally, wait_for

pytestmark = pytest.mark.slow

#: How each exiting task ends, and the class path its recorded error must name.
EXITS = [
    ("sys.exit", "builtins.SystemExit"),
    ("exit", "builtins.SystemExit"),
    ("KeyboardInterrupt", "builtins.KeyboardInterrupt"),
]


def test_tasks_that_raise_systemexit_or_keyboardinterrupt_are_failed_and_the_pool_keeps_serving(
    tally: Tally, fault_server, start_pool
):
    exiting = {how: tally.enqueue(1, tasks.count_then_exit, how=how)[0] for how, _ in EXITS}
    async_exit = tally.enqueue(1, tasks.async_count_then_exit)[0]
    innocent = tally.enqueue(20, sleep_ms=5)

    # One process, one thread: were the consumer to die, nothing would run after the first exit.
    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--exit-empty")
    wait_for(lambda: pool.process.poll() is not None, lambda: f"the pool drains and exits ({tally.summary()})", 30)

    assert pool.process.returncode == 0, pool.output[-3000:]
    assert pool.respawns() == [], pool.respawns()
    started, finished = tally.started(), tally.finished()
    for how, class_path in EXITS:
        result = tally.backend.get_result(exiting[how])
        assert result.status == TaskResultStatus.FAILED, (how, result.status)
        assert [e.exception_class_path for e in result.errors] == [class_path], how
        assert "count_then_exit" in result.errors[0].traceback, how
        assert started[exiting[how]] == 1, how
    result = tally.backend.get_result(async_exit)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]
    assert started[async_exit] == 1
    assert all(finished[task_id] == 1 for task_id in innocent), tally.summary()
    for task_id in innocent:
        assert tally.backend.get_result(task_id).status == TaskResultStatus.SUCCESSFUL
    # Everything it leased was settled, so it said goodbye: no heartbeat is left to age.
    assert tally.backend.worker_heartbeats() == {}


def test_the_retry_policy_decides_about_a_systemexit(tally: Tally, fault_server, start_pool):
    task_id = tally.enqueue(1, tasks.count_then_exit_once)[0]

    pool = start_pool(fault_server, "-w", "1", "-t", "1")
    wait_for(lambda: pool.alive() and tally.all_settled(), lambda: f"the retry runs ({tally.summary()})", 30)

    result = tally.backend.get_result(task_id)
    assert pool.stop() == 0, pool.output[-3000:]
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert [e.exception_class_path for e in result.errors] == ["builtins.SystemExit"]
    assert tally.started()[task_id] == 2 and tally.finished()[task_id] == 1
