"""Concurrency and rate limits held exactly by real pools, counted on the counter server.

Every task is `tests.tasks.count_concurrent`: it counts the runs at once on the counter server
(their peak kept atomically) and records each lease's start on the server's clock.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest

from tests import tasks
from tests.faults.conftest import FAULT_TIMEOUTS, SLACK_S, Tally, fault_backend, wait_for, wait_for_drain
from threadmill.limits import parse_rate
from threadmill.outcome import mark_successful

pytestmark = pytest.mark.slow

WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])
BROKER_INTERVAL_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_BROKER_INTERVAL"])
LEASE_TTL_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_LEASE_TTL"])


def _peak(tally: Tally) -> int:
    return int(tally.counter.get("limits:peak") or 0)


def _lease_times(tally: Tally) -> list[float]:
    return sorted(float(t) for t in tally.counter.lrange("limits:leases", 0, -1))


def _most_in_a_window(times: list[float], window_s: float) -> int:
    """The most of `times` (sorted) in any half-open window [t, t + window_s)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.parametrize("limit", ["queue", "task"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_four_processes_of_four_threads_never_run_more_than_the_concurrency_limit_at_once(
    counter, fault_server, start_pool, partitions, limit
):
    # With 3 partitions each holds a share of 1: the whole queue (or task) still runs at most 3 at once.
    tally = Tally(fault_backend(fault_server, partitions=partitions), counter)
    plain = []
    if limit == "queue":
        tally.backend.set_limit("default", concurrency=3, by="test")
        limited = tally.enqueue(90, task=tasks.count_concurrent, sleep_ms=30)
    else:
        # `@task(concurrency=3)`; plain tasks queued behind them run beside them, not after them.
        limited = tally.enqueue(60, task=tasks.count_concurrent_three_at_a_time, sleep_ms=30)
        plain = tally.enqueue(30, task=tasks.count_run)

    pool = start_pool(fault_server, "-w", "4", "-t", "4", THREADMILL_TEST_PARTITIONS=str(partitions))
    wait_for_drain(pool, tally, 60)

    tally.assert_each_ran_once()
    assert 1 <= _peak(tally) <= 3, f"peak running at once {_peak(tally)}, limit 3"
    if partitions == 1:
        assert _peak(tally) == 3, "the limit was never reached: the test proves nothing"
    if plain:
        finished_at = {t: tally.backend.get_result(t).finished_at for t in limited + plain}
        last_plain, last_limited = max(finished_at[t] for t in plain), max(finished_at[t] for t in limited)
        assert last_plain < last_limited, "the plain tasks waited behind the held ones"
    print(f"{limit} limit, {partitions} partition(s): peak running at once {_peak(tally)} of 16 threads, limit 3")


@pytest.mark.parametrize("limit", ["queue", "task"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_a_rate_of_20_a_second_admits_at_most_20_leases_in_any_second_and_exit_empty_waits_for_them(
    counter, fault_server, start_pool, partitions, limit
):
    # With 3 partitions the shares are 7, 7 and 6 a second.
    tally = Tally(fault_backend(fault_server, partitions=partitions), counter)
    if limit == "queue":
        tally.backend.set_limit("default", rate=parse_rate("20/s"), by="test")
        tally.enqueue(100, task=tasks.count_concurrent)
    else:
        tally.enqueue(100, task=tasks.count_concurrent_twenty_a_second)  # @task(rate="20/s")

    pool = start_pool(fault_server, "-w", "4", "-t", "4", "--exit-empty", THREADMILL_TEST_PARTITIONS=str(partitions))
    assert pool.process.wait(60) == 0, pool.output[-3000:]

    tally.assert_each_ran_once()
    times = _lease_times(tally)
    most = _most_in_a_window(times, 1.0)
    assert most <= 20, f"{most} leases in one second, rate 20/s"
    # The burst is 20 at once; the other 80 come one token at a time, so the drain takes 4 s at least.
    assert times[-1] - times[0] >= 3.9, f"100 leases in {times[-1] - times[0]:.2f} s at 20/s"
    print(
        f"{limit} limit, {partitions} partition(s): 100 tasks at 20/s in {times[-1] - times[0]:.2f} s; most in any second: {most}"
    )


@pytest.mark.parametrize("limit", ["queue", "task"])
def test_a_killed_worker_s_slots_are_freed_when_its_leases_are_recovered_not_at_the_lease_ttl(
    tally: Tally, fault_server, start_pool, limit
):
    if limit == "queue":
        tally.backend.set_limit("default", concurrency=3, by="test")
        task = tasks.count_concurrent
    else:
        task = tasks.count_concurrent_three_at_a_time  # @task(concurrency=3)
    stuck = tally.enqueue(3, task=task, first_attempt_sleep_ms=120_000)
    waiting = tally.enqueue(6, task=task, sleep_ms=20)
    pool = start_pool(fault_server, "-w", "1", "-t", "4")
    wait_for(lambda: pool.alive() and len(tally.started()) == 3, lambda: f"three tasks start ({tally.summary()})", 30)
    assert set(tally.started()) == set(stuck), "the limit let a fourth task start"
    victim = pool.children()[0]

    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    # The killed runs never counted themselves out.
    tally.counter.set("limits:running", 0)
    tally.counter.set("limits:peak", 0)

    wait_for_drain(pool, tally, WORKER_TIMEOUT_S + BROKER_INTERVAL_S + 10 + SLACK_S)
    drained_in = time.monotonic() - killed_at
    assert drained_in < LEASE_TTL_S / 2
    assert set(tally.ran()) == set(stuck) | set(waiting)
    assert _peak(tally) <= 3, f"peak running at once after the recovery {_peak(tally)}, limit 3"
    print(
        f"the killed worker's 3 slots freed and all 9 tasks done {drained_in:.1f} s after the kill (lease_ttl {LEASE_TTL_S:g} s)"
    )


@pytest.mark.parametrize("limit", ["queue", "task"])
def test_an_idle_worker_waiting_on_a_held_back_queue_wakes_when_an_acknowledgement_frees_the_slot(
    tally: Tally, fault_server, start_pool, limit
):
    backend = tally.backend
    if limit == "queue":
        backend.set_limit("default", concurrency=1, by="test")
        task, slots = tasks.count_concurrent, 1
    else:
        task, slots = tasks.count_concurrent_three_at_a_time, 3  # @task(concurrency=3)
    holder = "test:1:holder"
    held_ids = tally.enqueue(slots, task=task)
    leased = backend.acquire("default", count=slots, worker=holder)
    assert {r.id for r in leased} == set(held_ids)
    held, held_id = leased[0], leased[0].id
    [waiting] = tally.enqueue(1, task=task)
    pool = start_pool(fault_server, "-w", "1", "-t", "1")

    def waits_on_the_server() -> bool:
        backend.heartbeat(holder, {"type": "worker", "worker": holder, "queues": ["default"]})  # not recovered
        return pool.alive() and any("b" in c["flags"] for c in backend.client.client_list())

    wait_for(waits_on_the_server, lambda: "the pool's worker waits on the wake lists", 30)
    assert not tally.started(), "the limit let the second task start"
    mark_successful(held, datetime.now(UTC))
    assert backend.acknowledge(held)
    acknowledged_at = time.monotonic()

    # Well inside the worker's 5 s idle wait: the acknowledgement woke it, no timeout did.
    wait_for(lambda: tally.started()[waiting], lambda: f"the waiting task starts ({tally.summary()})", 2.5)
    print(f"the held-back task started {time.monotonic() - acknowledged_at:.2f} s after the slot freed")
    assert held_id not in tally.started()


def test_a_workflow_s_fan_out_of_limited_tasks_runs_at_most_the_limit_at_once_and_joins_once(
    tally: Tally, fault_server, start_pool
):
    # 45 `@task(concurrency=3)` children a root releases at once, then a join of them all, on 16 threads.
    from threadmill.workflows import Workflow

    wf = Workflow(name="limited fan-out")
    root = wf.add(tasks.count_run)
    children = [
        wf.add(tasks.count_concurrent_three_at_a_time, kwargs={"sleep_ms": 30}, after=[root]) for _ in range(45)
    ]
    join = wf.add(tasks.count_run, after=children)
    wf.check()
    run = tally.backend.enqueue_workflow(wf)  # the backend under test, not the settings' default
    tally.ids += [node.id for node in (root, *children, join)]

    pool = start_pool(fault_server, "-w", "4", "-t", "4")
    wait_for_drain(pool, tally, 60)

    tally.assert_each_ran_once()
    assert _peak(tally) == 3, f"peak running at once {_peak(tally)}, limit 3"
    results = {node: tally.backend.get_result(node.id) for node in (root, *children, join)}
    assert min(results[c].started_at for c in children) >= results[root].finished_at
    assert results[join].started_at >= max(results[c].finished_at for c in children)
    run = tally.backend.get_workflow(run.id)
    assert run.status.name == "SUCCESSFUL" and run.counts["SUCCESSFUL"] == 47
    print(f"workflow of 45 limited children: peak running at once {_peak(tally)} of 16 threads, limit 3")
