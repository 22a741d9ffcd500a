"""A pool killed and restarted in a fresh PID namespace, as a container restart does.

In a new PID namespace the supervisor is pid 1 and its worker processes get the next small
pids, so a restart gives the new processes the old pids exactly, on the same hostname. The
dead processes' names must not come back to life with them.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.tasks import TaskResultStatus

from tests.faults.conftest import FAULT_TIMEOUTS, SLACK_S, Tally, wait_for, wait_for_drain
from threadmill.identity import WorkerName

pytestmark = pytest.mark.slow

WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])
SOCKET_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_SOCKET_TIMEOUT"])
BROKER_INTERVAL_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_BROKER_INTERVAL"])
#: The errors recovery records for an attempt its lost worker was running.
LOST = "threadmill.exceptions.WorkerLost"


def _leases(tally: Tally) -> dict[str, tuple[str, str]]:
    """Each running task's (lease worker, lease token)."""
    pipe = tally.backend.client.pipeline(transaction=False)
    for task_id in tally.ids:
        pipe.hmget(tally.backend.task_keys(task_id).task(task_id), ["segment", "lease_worker", "lease_token"])
    return {
        task_id: (worker.decode(), token.decode())
        for task_id, (segment, worker, token) in zip(tally.ids, pipe.execute(), strict=True)
        if segment == b"running"
    }


def test_a_pool_killed_and_restarted_in_a_fresh_pid_namespace_runs_every_task_again_within_the_worker_timeout(
    tally: Tally, fault_server, start_namespaced_pool
):
    tally.enqueue(60, sleep_ms=400)
    # A fixed buffer: sized by time, 400 ms tasks would be held 1 per thread and the rest handed back.
    first = start_namespaced_pool(fault_server, "-w", "2", "-t", "2", "--prefetch-count", "8")
    # Both processes run tasks and hold more in their buffers.
    wait_for(
        lambda: (
            first.alive()
            and len({worker for worker, _ in _leases(tally).values()}) == 2
            and len(_leases(tally)) >= 12
            and sum(tally.started().values()) >= 4
        ),
        lambda: f"both worker processes run tasks and buffer more ({tally.summary()})",
        30,
    )

    first.kill_namespace()
    killed_at = time.monotonic()
    held = _leases(tally)
    started, finished = tally.started(), tally.finished()
    old_names = {worker for worker, _ in held.values()}
    assert len(held) >= 12, tally.summary()
    assert any(started[i] and not finished[i] for i in held) and any(not started[i] for i in held), tally.summary()

    second = start_namespaced_pool(fault_server, "-w", "2", "-t", "2", "--prefetch-count", "8")

    # The new broker trusts heartbeats worker_timeout + socket_timeout after it first reaches the server.
    wait_for(
        lambda: second.alive() and not [i for i, lease in _leases(tally).items() if held.get(i) == lease],
        lambda: f"the {len(held)} leases of the killed pool are taken back ({tally.summary()})",
        WORKER_TIMEOUT_S + SOCKET_TIMEOUT_S + BROKER_INTERVAL_S + SLACK_S,
    )
    recovered_in = time.monotonic() - killed_at
    new_names = set(tally.backend.worker_heartbeats()) - old_names
    # The fault really happened: the new processes have the old pids, under new names.
    assert {WorkerName.parse(n).pid for n in old_names} & {WorkerName.parse(n).pid for n in new_names}, (
        old_names,
        new_names,
    )
    wait_for_drain(second, tally, 60)

    # Only a task that had finished in the killed pool, its acknowledgement not yet sent, may run again.
    unacknowledged = {task_id for task_id in held if finished[task_id]}
    twice = tally.ran_twice()
    assert set(twice) <= unacknowledged and set(twice.values()) <= {2}, (twice, unacknowledged)
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    for task_id in held:
        result = tally.backend.get_result(task_id)
        lost = [e for e in result.errors if e.exception_class_path == LOST]
        assert len(lost) <= 1 and not (set(result.worker_ids[:-1]) - old_names), (task_id, result.worker_ids)
    print(f"{len(held)} leases of the killed pool recovered {recovered_in:.1f} s after the kill")


def test_two_pools_in_pid_namespaces_of_their_own_share_pids_and_a_kill_9_in_one_costs_the_other_nothing(
    tally: Tally, fault_server, start_namespaced_pool
):
    # Two containers of one Deployment on one node: the same hostname, and each pool's worker
    # process is pid 2 of its own namespace. Only the incarnation tells their names apart.
    tally.enqueue(300, sleep_ms=30)
    one = start_namespaced_pool(fault_server, "-w", "1", "-t", "2")
    other = start_namespaced_pool(fault_server, "-w", "1", "-t", "2")
    holders = wait_for(
        lambda: (
            one.alive()
            and other.alive()
            and len(names := {worker for worker, _ in _leases(tally).values()}) == 2
            and tally.successful() >= 20
            and names
        ),
        lambda: f"both pools hold leases ({tally.summary()})",
        30,
    )
    assert len({WorkerName.parse(name).pid for name in holders}) == 1, f"the pools' pids differ: {holders}"
    (victim,) = one.children()
    victim_name = next(name for name in holders if name in one.output)
    survivor_name = next(iter(holders - {victim_name}))

    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in one.children(), lambda: "the killed process is gone", 10)
    # Only a task the killed process had finished, its acknowledgement not yet sent, may run again.
    may_run_twice = set(tally.finished())

    wait_for_drain(other, tally, WORKER_TIMEOUT_S + SOCKET_TIMEOUT_S + BROKER_INTERVAL_S + 60)
    twice = tally.ran_twice()
    assert set(twice) <= may_run_twice and len(twice) <= 2, f"ran twice: {twice}"
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    abandoned_by = {
        attempt.worker
        for task_id in tally.ids
        for attempt in tally.backend.get_result(task_id).attempt_records
        if attempt.outcome == "abandoned"
    }
    assert victim_name in abandoned_by, "the killed process's leases were not recovered as abandoned"
    assert survivor_name not in abandoned_by, "recovery took the survivor's leases: its name shares the killed pid"
    assert "respawning it" in one.output and "respawning it" not in other.output
