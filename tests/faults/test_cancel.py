"""Cancel and abort on real worker pools: runs counted on the counter server, cancels racing a drain.

Every start and finish is counted on the counter server, so the counts say what really ran.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.faults.conftest import SLACK_S, Tally, wait_for
from threadmill.backends.tooling.actions import CancelOutcome
from threadmill.base import Segment

pytestmark = pytest.mark.slow

CANCELLED = "threadmill.exceptions.TaskCancelled"


def _error_paths(tally: Tally, task_id: str) -> list[str]:
    return [e.exception_class_path for e in tally.backend.get_result(task_id).errors]


def test_cancelling_half_of_a_thousand_tasks_while_a_pool_drains_loses_none_and_runs_none_after_its_cancel(
    tally: Tally, fault_server, start_pool
):
    ids = tally.enqueue(1000, sleep_ms=3)
    cancelled_ids, kept_ids = ids[1::2], ids[0::2]
    pool = start_pool(fault_server, "-w", "2", "-t", "4", "--exit-empty")
    wait_for(lambda: pool.alive() and tally.started(), lambda: "the first task starts", 30)

    outcomes = {task_id: tally.backend.cancel_outcome(task_id, by="the race") for task_id in cancelled_ids}

    wait_for(lambda: pool.process.poll() is not None, lambda: f"the pool drains and exits ({tally.summary()})", 60)
    assert pool.process.returncode == 0, pool.output[-3000:]
    by_outcome = Counter(outcomes.values())
    print(f"\ncancels racing the drain: { {o.value: n for o, n in by_outcome.items()} }")
    assert set(by_outcome) <= {CancelOutcome.CANCELLED, CancelOutcome.ABORT_REQUESTED, CancelOutcome.ALREADY_FINISHED}
    assert by_outcome[CancelOutcome.CANCELLED] > 0  # the race did race: some were still ready
    started, finished = tally.started(), tally.finished()
    statuses = {task_id: tally.backend.get_result(task_id).status for task_id in ids}
    # None lost: every task finished; the ones nobody cancelled ran once and succeeded.
    assert Counter(statuses.values()).total() == 1000 and tally.all_settled(), tally.summary()
    assert all(statuses[i] == TaskResultStatus.SUCCESSFUL and finished[i] == 1 for i in kept_ids), tally.summary()
    for task_id, outcome in outcomes.items():
        assert started[task_id] <= 1, task_id  # never retried
        if outcome is CancelOutcome.CANCELLED:
            # Acknowledged as cancelled before any worker leased it: it never started.
            assert started[task_id] == 0 and statuses[task_id] == TaskResultStatus.FAILED, task_id
            assert _error_paths(tally, task_id) == [CANCELLED]
        elif outcome is CancelOutcome.ABORT_REQUESTED:
            # Leased when the cancel came: aborted, or finished before the request reached it.
            assert statuses[task_id] == TaskResultStatus.SUCCESSFUL or _error_paths(tally, task_id) == [CANCELLED]
        else:
            assert statuses[task_id] == TaskResultStatus.SUCCESSFUL and finished[task_id] == 1


def test_an_abort_reaches_a_running_task_within_two_seconds_p90_over_thirty_tasks(
    tally: Tally, fault_server, start_pool
):
    ids = tally.enqueue(30, tasks.wait_for_abort)
    pool = start_pool(fault_server, "-w", "1", "-t", "30")
    wait_for(lambda: pool.alive() and len(tally.started()) == 30, lambda: f"all 30 start ({tally.summary()})", 30)

    asked_at = {}
    for task_id in ids:
        asked_at[task_id] = time.time()
        assert tally.backend.cancel(task_id, by="the latency test") is True
        time.sleep(0.037)  # Spreads the requests over the fetchers' look-ups; not a synchronisation.
    reached = wait_for(
        lambda: len(got := tally._counts_raw("faults:aborting_at")) == 30 and got,
        lambda: f"every task sees aborting() ({tally.summary()})",
        30,
    )

    latencies = sorted(float(reached[task_id]) - asked_at[task_id] for task_id in ids)
    p90 = latencies[int(0.9 * len(latencies)) - 1]
    print(
        f"\nabort delivery over 30 tasks: median {1000 * statistics.median(latencies):.0f} ms, "
        f"p90 {1000 * p90:.0f} ms, max {1000 * latencies[-1]:.0f} ms"
    )
    assert p90 < 2.0, latencies
    wait_for(lambda: tally.all_settled(), lambda: f"every aborted task is acknowledged ({tally.summary()})", 10)
    for task_id in ids:
        result = tally.backend.get_result(task_id)
        assert result.status == TaskResultStatus.FAILED and _error_paths(tally, task_id) == [CANCELLED]
        assert "was aborted by the latency test" in result.errors[0].traceback


def test_a_buffered_task_whose_abort_arrives_before_it_starts_never_runs_and_ends_cancelled(
    tally: Tally, fault_server, start_pool
):
    (blocker,) = tally.enqueue(1, tasks.wait_for_abort)
    waiting = tally.enqueue(3, sleep_ms=1)
    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--prefetch-count", "4")
    wait_for(
        lambda: pool.alive() and tally.started()[blocker] and tally.segments()[Segment.RUNNING] == 4,
        lambda: f"the blocker runs and the other three are leased into the buffer ({tally.summary()})",
        30,
    )

    assert all(tally.backend.cancel(task_id, by="the buffer test") is True for task_id in waiting)

    # Settled while the only consumer thread is still busy with the blocker: they never started.
    wait_for(
        lambda: all(tally.backend.get_result(i).status == TaskResultStatus.FAILED for i in waiting),
        lambda: f"the three aborted tasks end without running ({tally.summary()})",
        10,
    )
    assert tally.started()[blocker] == 1 and tally.finished()[blocker] == 0
    assert tally.backend.cancel(blocker) is True
    wait_for(lambda: tally.all_settled(), lambda: f"the blocker is aborted too ({tally.summary()})", 10)
    for task_id in waiting:
        assert tally.started()[task_id] == 0, task_id
        assert _error_paths(tally, task_id) == [CANCELLED]
        assert "aborted by the buffer test" in tally.backend.get_result(task_id).errors[0].traceback
    assert pool.respawns() == []


def test_a_task_that_ignores_the_abort_gets_taskcancelled_after_the_grace_and_its_finally_runs(
    tally: Tally, fault_server, start_pool
):
    (task_id,) = tally.enqueue(1, tasks.ignore_abort)
    pool = start_pool(fault_server, "-w", "1", "-t", "1", "--exit-empty", THREADMILL_TEST_ABORT_GRACE="0.5")
    wait_for(lambda: pool.alive() and tally.started()[task_id], lambda: "the task starts", 30)

    assert tally.backend.cancel(task_id) is True

    wait_for(
        lambda: pool.process.poll() is not None, lambda: f"the pool drains and exits ({tally.summary()})", 10 + SLACK_S
    )
    assert pool.process.returncode == 0, pool.output[-3000:]
    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.FAILED and _error_paths(tally, task_id) == [CANCELLED]
    assert "was aborted by" in result.errors[0].traceback and "ignore_abort" in result.errors[0].traceback
    assert tally._counts("faults:finally")[task_id] == 1 and tally.finished()[task_id] == 0
    assert pool.respawns() == []


def test_an_async_task_that_ignores_the_abort_is_cancelled_after_the_grace_and_its_process_lives(
    tally: Tally, fault_server, start_pool
):
    (task_id,) = tally.enqueue(1, tasks.async_ignore_abort)
    pool = start_pool(
        fault_server, "-w", "1", "-t", "1", "--exit-empty",
        THREADMILL_TEST_ABORT_GRACE="0.3", THREADMILL_TEST_TIMEOUT_GRACE="20",
    )  # fmt: skip
    wait_for(lambda: pool.alive() and tally.started()[task_id], lambda: "the task starts", 30)

    assert tally.backend.cancel(task_id) is True

    # Its coroutine is cancelled on its own loop at the grace: well before the 20 s escalation.
    wait_for(
        lambda: pool.process.poll() is not None, lambda: f"the pool drains and exits ({tally.summary()})", 10 + SLACK_S
    )
    assert pool.process.returncode == 0, pool.output[-3000:]
    result = tally.backend.get_result(task_id)
    assert result.status == TaskResultStatus.FAILED and _error_paths(tally, task_id) == [CANCELLED]
    assert "was aborted by" in result.errors[0].traceback and "was replaced" not in result.errors[0].traceback
    assert tally._counts("faults:finally")[task_id] == 1 and tally.finished()[task_id] == 0
    assert pool.respawns() == []


def test_a_task_stuck_in_c_past_the_abort_grace_is_recorded_cancelled_and_its_process_replaced(
    tally: Tally, fault_server, start_pool
):
    (task_id,) = tally.enqueue(1, tasks.abort_stuck_in_c)
    pool = start_pool(
        fault_server, "-w", "1", "-t", "2", THREADMILL_TEST_ABORT_GRACE="0.3", THREADMILL_TEST_TIMEOUT_GRACE="1"
    )
    wait_for(lambda: pool.alive() and tally.started()[task_id], lambda: "the task starts", 30)

    tally.backend.cancel(task_id)

    wait_for(lambda: tally.all_settled(), lambda: f"the stuck task is recorded ({tally.summary()})", 10 + SLACK_S)
    result = tally.backend.get_result(task_id)
    assert _error_paths(tally, task_id) == [CANCELLED] and "was replaced" in result.errors[0].traceback
    wait_for(lambda: pool.respawns(), lambda: "the supervisor replaces the process", 10)
