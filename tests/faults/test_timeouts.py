"""Time limits on real worker pools: TaskTimeout in sync and async tasks, the process replaced past the grace.

Starts, finishes, cancellations and `finally` blocks are counted on the counter server. The
limit is `tests.tasks.SHORT_LIMIT_S`, the grace is set per pool (THREADMILL_TEST_TIMEOUT_GRACE).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.faults.conftest import SLACK_S, Tally, wait_for
from threadmill.base import Segment

pytestmark = pytest.mark.slow

TIMEOUT = "threadmill.exceptions.TaskTimeout"
ABANDONED = "threadmill.exceptions.AttemptAbandoned"


def _drained(pool, tally: Tally, timeout: float = 30) -> None:
    wait_for(lambda: pool.process.poll() is not None, lambda: f"the pool drains and exits ({tally.summary()})", timeout)
    assert pool.process.returncode == 0, pool.output[-3000:]


def test_a_sync_task_past_its_limit_fails_with_tasktimeout_and_its_finally_runs(tally: Tally, fault_server, start_pool):
    (task_id,) = tally.enqueue(1, tasks.sleep_past_limit)

    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--exit-empty", THREADMILL_TEST_TIMEOUT_GRACE="5")
    _drained(pool, tally)

    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]
    assert f"passed its time limit of {tasks.SHORT_LIMIT_S:g} s" in result.errors[0].traceback
    assert "sleep_past_limit" in result.errors[0].traceback  # raised where the task was
    assert tally._counts("faults:finally")[task_id] == 1
    assert tally.started()[task_id] == 1 and tally.finished()[task_id] == 0
    assert pool.respawns() == [], pool.respawns()  # the exception ended it: nothing was replaced


def test_an_async_task_past_its_limit_is_cancelled_and_fails_with_tasktimeout(tally: Tally, fault_server, start_pool):
    (task_id,) = tally.enqueue(1, tasks.async_sleep_past_limit)

    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--exit-empty", THREADMILL_TEST_TIMEOUT_GRACE="5")
    _drained(pool, tally)

    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]
    assert "async_sleep_past_limit" in result.errors[0].traceback
    assert tally._counts("faults:cancelled")[task_id] == 1 and tally._counts("faults:finally")[task_id] == 1
    assert tally.finished()[task_id] == 0
    assert pool.respawns() == [], pool.respawns()


def test_the_retry_policy_decides_after_a_timeout(tally: Tally, fault_server, start_pool):
    (task_id,) = tally.enqueue(1, tasks.past_limit_once)

    pool = start_pool(fault_server, "-w", "1", "-t", "1", THREADMILL_TEST_TIMEOUT_GRACE="5")
    wait_for(lambda: pool.alive() and tally.all_settled(), lambda: f"the retry runs ({tally.summary()})", 30)
    assert pool.stop() == 0, pool.output[-3000:]

    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert [e.exception_class_path for e in result.errors] == [TIMEOUT]
    assert tally.started()[task_id] == 2 and tally.finished()[task_id] == 1


def test_a_task_stuck_in_c_past_limit_and_grace_replaces_its_process_and_its_neighbour_runs_again(
    tally: Tally, fault_server, start_pool
):
    grace_s = 1.0
    (stuck,) = tally.enqueue(1, tasks.stuck_in_c)
    # Still running when the stuck one is given up, quick on its next run.
    (neighbour,) = tally.enqueue(1, first_attempt_sleep_ms=30_000)

    pool = start_pool(fault_server, "-w", "1", "-t", "2", "--exit-empty", THREADMILL_TEST_TIMEOUT_GRACE=str(grace_s))
    _drained(pool, tally, 40)

    timed_out = tally.backend.get_result(stuck)
    assert timed_out.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in timed_out.errors] == [TIMEOUT]
    assert f"had not ended {grace_s:g} s later" in timed_out.errors[0].traceback
    assert tally.started()[stuck] == 1 and tally.finished()[stuck] == 0
    # The neighbour is not blamed: handed back as an interrupted attempt, run again by the new process.
    handed_back = tally.backend.get_result(neighbour)
    assert handed_back.status == TaskResultStatus.SUCCESSFUL
    assert [e.exception_class_path for e in handed_back.errors] == [ABANDONED]
    assert "outlived its time limit" in handed_back.errors[0].traceback
    assert tally.started()[neighbour] == 2 and tally.finished()[neighbour] == 1
    assert len(set(handed_back.worker_ids)) == 2  # the second run was another process's
    # Given up at limit + grace, and the replacement ran the neighbour again soon after.
    given_up_after = (timed_out.finished_at - timed_out.last_attempted_at).total_seconds()
    assert given_up_after <= tasks.SHORT_LIMIT_S + grace_s + SLACK_S, given_up_after
    replaced_within = (handed_back.last_attempted_at - timed_out.last_attempted_at).total_seconds()
    assert replaced_within <= tasks.SHORT_LIMIT_S + grace_s + SLACK_S, replaced_within
    assert any("replaced itself after a task outlived its time limit" in line for line in pool.respawns())
    assert tally.segments()[Segment.RUNNING] == 0


def test_the_lease_of_a_bounded_task_covers_limit_and_grace_past_a_short_lease_ttl(
    tally: Tally, fault_server, start_pool
):
    limit_s, grace_s = 2.0, 1.0
    bounded = replace(tasks.count_run, timeout=timedelta(seconds=limit_s))
    (task_id,) = tally.enqueue(1, bounded, sleep_ms=1500)

    # A 0.5 s lease_ttl and a broker pass every 0.2 s: the reaper would take the run back at 0.5 s.
    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--exit-empty",
                      THREADMILL_TEST_LEASE_TTL="0.5", THREADMILL_TEST_TIMEOUT_GRACE=str(grace_s))  # fmt: skip
    wait_for(lambda: tally.started()[task_id] == 1, lambda: f"the task starts ({tally.summary()})", 20)
    keys = tally.backend.task_keys(task_id)
    deadline = tally.backend.client.zscore(keys.segment("default", Segment.RUNNING), task_id)
    started = float(tally.backend.client.hget(keys.task(task_id), "lease_started_at"))
    assert deadline - started >= limit_s + grace_s
    _drained(pool, tally)

    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.errors == []
    assert tally.started()[task_id] == 1 and tally.finished()[task_id] == 1


def test_a_process_whose_every_thread_is_stuck_is_killed_by_its_supervisor(tally: Tally, fault_server, start_pool):
    grace_s = 0.5
    (task_id,) = tally.enqueue(1, tasks.hold_the_gil_once)

    pool = start_pool(fault_server, "-w", "1", "-t", "1", THREADMILL_TEST_TIMEOUT_GRACE=str(grace_s))
    wait_for(lambda: pool.alive() and tally.all_settled(), lambda: f"the task runs again ({tally.summary()})", 30)
    assert pool.stop() == 0, pool.output[-3000:]

    # Its heartbeat stopped with it: the broker recovered the lease as a lost worker's, and it ran again.
    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert [e.exception_class_path for e in result.errors] == ["threadmill.exceptions.WorkerLost"]
    assert "did not replace itself after a task outlived its time limit; killing it" in pool.output
    assert tally.started()[task_id] == 2
