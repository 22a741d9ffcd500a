"""A worker process frozen (SIGSTOP) for twice `worker_timeout`, while another pool serves the queue.

The broker recovers the frozen process's leases and the other pool runs them. When the frozen
process resumes, it must not run its stale buffer on trust: only a task that had started
before the freeze may run again (its late acknowledgement is refused). Counted on the
counter server.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.tasks import TaskResultStatus

from tests.faults.conftest import FAULT_TIMEOUTS, Tally, wait_for, wait_for_drain

pytestmark = pytest.mark.slow

WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])


def _running_holders(tally: Tally) -> set[str]:
    """The worker names that hold a lease on some task now."""
    pipe = tally.backend.client.pipeline(transaction=False)
    for task_id in tally.ids:
        pipe.hmget(tally.backend.task_keys(task_id).task(task_id), ["segment", "lease_worker"])
    return {holder.decode() for segment, holder in pipe.execute() if segment == b"running" and holder}


def _holds_nothing(document: dict | None) -> bool:
    return document is not None and document["buffered"] == [] and document["running"] == []


def _wait_until_it_settles(pool, tally: Tally, name: str) -> None:
    """Wait until the resumed process ran or handed back its buffer, so nothing it does is left uncounted."""
    wait_for(
        lambda: pool.alive() and _holds_nothing(tally.backend.worker_document(name)),
        lambda: f"the resumed process settles its buffer ({tally.backend.worker_document(name)})",
        15,
    )


def test_a_process_frozen_past_the_worker_timeout_does_not_run_its_stale_buffer(tally: Tally, fault_server, start_pool):
    tally.enqueue(60, sleep_ms=100)
    frozen_pool = start_pool(fault_server, "-w", "1", "-t", "1", "--prefetch-count", "10")
    wait_for(
        lambda: frozen_pool.alive() and tally.successful() >= 3 and len(tally.segments_running()) >= 5,
        lambda: f"the pool runs with a full buffer ({tally.summary()})",
        30,
    )
    (victim,) = frozen_pool.children()
    (victim_name,) = _running_holders(tally)
    os.kill(victim, signal.SIGSTOP)
    started_before = {task_id for task_id, n in tally.started().items() if n}
    try:
        other_pool = start_pool(fault_server, "-w", "1", "-t", "2")
        time.sleep(2 * WORKER_TIMEOUT_S)  # The freeze itself, not a synchronisation.
        assert victim_name not in _running_holders(tally), "the broker did not recover the frozen process's leases"
    finally:
        os.kill(victim, signal.SIGCONT)

    wait_for_drain(other_pool, tally, 30)
    _wait_until_it_settles(frozen_pool, tally, victim_name)
    twice = tally.ran_twice()
    assert set(twice) <= started_before and len(twice) <= 1, (
        f"ran twice: {twice}; only a task started before the freeze may: {sorted(started_before)[-3:]}"
    )
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    assert "buffered tasks go back unstarted" in frozen_pool.output, frozen_pool.output[-3000:]
    print(f"frozen {2 * WORKER_TIMEOUT_S:g} s; ran twice: {len(twice)}")


def test_a_process_frozen_across_a_server_restart_leases_nothing_until_its_heartbeat_is_stored(
    tally: Tally, fault_server, start_pool
):
    pool = start_pool(fault_server, "-w", "2", "-t", "1")
    wait_for(lambda: pool.alive() and len(pool.worker_names()) == 2, lambda: "two worker processes report", 30)
    victim = pool.children()[0]
    victim_name = pool.worker_name(victim)
    wait_for(lambda: victim_name in tally.backend.worker_heartbeats(), lambda: "the victim's heartbeat is stored", 10)
    os.kill(victim, signal.SIGSTOP)
    try:
        # Its connections die with the server: on resume its first heartbeat fails, and it must not
        # lease on an old heartbeat, which the broker takes for a dead worker's.
        fault_server.restart()
        wait_for(
            lambda: (
                (beat := tally.backend.worker_heartbeats().get(victim_name)) is None
                or tally.backend.server_time().timestamp() - beat > 2 * WORKER_TIMEOUT_S
            ),
            lambda: "the frozen process's heartbeat is older than twice the worker timeout",
            30,
        )
        tally.enqueue(300, sleep_ms=30)  # a backlog for the resumed process to lease from
    finally:
        os.kill(victim, signal.SIGCONT)

    wait_for_drain(pool, tally, 60)
    _wait_until_it_settles(pool, tally, victim_name)
    tally.assert_each_ran_once()
