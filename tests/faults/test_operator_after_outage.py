"""The operator's "requeue all orphaned" right after the server was down: a live worker's task never runs twice.

A server that comes back restores every heartbeat as it was when it went down, and live
workers need `worker_timeout` + `socket_timeout` to store their next one. Until the server
has been up that long, the API, the console and the CLI count no worker with a heartbeat as
gone: its running tasks stay, the result says when to try again, and afterwards a dead
worker's task moves as before. The pools and this process use the fault suite's timeouts
(worker_timeout 2 s, socket_timeout 1 s), so that wait is 3 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.faults.conftest import FAULT_TIMEOUTS, SLACK_S, fault_backend, wait_for, wait_for_drain
from tests.inspector.conftest import client_as, csrf_post, operator, operator_client  # noqa: F401 - fixtures
from threadmill import api
from threadmill.backends.partitions import partition_of
from threadmill.exceptions import ServerUnreachable

pytestmark = pytest.mark.slow

#: Seconds the server is down: longer than worker_timeout, so every heartbeat is older than it on return.
OUTAGE_S = 4.0
WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])
SOCKET_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_SOCKET_TIMEOUT"])
#: How long the server must be up before an old heartbeat means a gone worker.
SETTLE_S = WORKER_TIMEOUT_S + SOCKET_TIMEOUT_S


@pytest.fixture
def api_backend(fault_server, settings):
    """Point this process's `default` backend, the one threadmill.api reads, at the server under test."""
    from django.tasks import task_backends

    alias = settings.TASKS["default"]
    options = {**alias["OPTIONS"], "worker_timeout": WORKER_TIMEOUT_S, "socket_timeout": SOCKET_TIMEOUT_S}
    settings.TASKS = {"default": {**alias, "REDIS_URL": fault_server.url, "OPTIONS": {**options, "lease_ttl": 60}}}
    backend = task_backends["default"]
    assert backend.config.heartbeat_settle == SETTLE_S
    return backend


def once_answered(call: Callable[[], Any]) -> Any:
    """Make `call` as soon as the server under test answers it (the first call after its return may fail)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            return call()
        except ServerUnreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def requeue_orphaned() -> api.Requeued:
    return api.controls.requeue_orphaned("default", "default")


def settled(backend) -> bool:
    return backend.heartbeat_reading().settles_in(SETTLE_S) == 0


def test_requeue_orphaned_right_after_an_outage_leaves_a_live_workers_running_task(
    fault_server, tally, start_pool, api_backend
):
    [task_id] = tally.enqueue(1, sleep_ms=12_000)
    pool = start_pool(fault_server, "-w", "1", "-t", "1")
    wait_for(lambda: pool.alive() and tally.started()[task_id] == 1, lambda: "the task starts", 30)

    fault_server.down_for(OUTAGE_S)  # The worker lives on; its heartbeat is as old as the outage.
    done = once_answered(requeue_orphaned)

    assert done.moved == [] and done.held_back == [task_id], done
    assert done.notice.startswith("The server restarted "), done.notice
    assert "1 running task whose worker's heartbeat is old stayed: try again in " in done.notice
    # Once the server has been up long enough, the live worker has reported: still no orphan.
    wait_for(lambda: settled(api_backend), lambda: f"the server is up {SETTLE_S:g} s", SETTLE_S + SLACK_S)
    assert requeue_orphaned() == api.Requeued([])
    assert tally.segment_of(task_id) == "running" and tally.started()[task_id] == 1

    wait_for_drain(pool, tally, 30)
    tally.assert_each_ran_once()
    assert tally.started()[task_id] == 1


def test_requeue_orphaned_after_an_outage_takes_a_dead_workers_task_back_once_live_ones_could_report(
    fault_server, tally, start_pool, api_backend
):
    [task_id] = tally.enqueue(1, sleep_ms=20, first_attempt_sleep_ms=60_000)
    pool = start_pool(fault_server, "-w", "1", "-t", "1")
    wait_for(lambda: pool.alive() and tally.started()[task_id] == 1, lambda: "the task starts", 30)
    [worker] = pool.worker_names()
    pool.close()  # kill -9 of the supervisor and its worker process: no broker is left to recover the lease

    fault_server.down_for(OUTAGE_S)
    back = time.monotonic()
    held = once_answered(requeue_orphaned)
    assert held.moved == [] and held.held_back == [task_id], held

    moved = wait_for(lambda: requeue_orphaned().moved, lambda: "the dead worker's task moves", SETTLE_S + SLACK_S)
    # Whole seconds of uptime, and the server started a little before down_for returned.
    assert moved == [task_id] and time.monotonic() - back >= SETTLE_S - 1
    assert worker in tally.backend.get_result(task_id).worker_ids

    second = start_pool(fault_server, "-w", "1", "-t", "1")
    wait_for_drain(second, tally, 30)
    assert tally.started()[task_id] == 2 and tally.finished()[task_id] == 1, tally.summary()


@pytest.mark.django_db
def test_the_console_flags_no_worker_gone_right_after_an_outage_and_says_when_to_try_again(
    fault_server, api_backend, operator_client
):
    from tests.tasks import echo

    task_id = echo.enqueue("held").id
    api_backend.heartbeat("box:1:a1", {"type": "worker", "worker": "box:1:a1"}, publish=False)
    [leased] = api_backend.acquire("default", worker="box:1:a1")
    assert leased.id == task_id
    fault_server.down_for(OUTAGE_S)  # Nothing beats for box:1:a1 again: it is gone, but too soon to tell.

    # This process's connections meet the restart here, not in the pages (which would show an error page).
    once_answered(lambda: (api.controls.lease_check("default"), api_backend.live_leases("default", [task_id])))
    page = operator_client.get("/threadmill/default/default/running/").content.decode()
    assert task_id in page and 'data-flag="gone"' not in page and "Requeue all 0 orphaned" in page
    csrf_post(operator_client, "/threadmill/default/default/running/requeue-orphaned/", {})
    page = operator_client.get("/threadmill/default/default/running/").content.decode()
    assert "Requeued 0 tasks whose worker is gone or whose lease is overdue. The server restarted " in page
    assert "try again in " in page
    assert api_backend.in_segment("default", "running", [task_id]) == [task_id]

    wait_for(lambda: settled(api_backend), lambda: f"the server is up {SETTLE_S:g} s", SETTLE_S + SLACK_S)
    assert 'data-flag="gone"' in operator_client.get("/threadmill/default/default/running/").content.decode()


def test_a_requeue_of_running_tasks_right_after_an_outage_skips_every_partitions_old_heartbeats(fault_server):
    from tests.tasks import echo

    timeouts = {"worker_timeout": WORKER_TIMEOUT_S, "socket_timeout": SOCKET_TIMEOUT_S}
    backend = fault_backend(fault_server, partitions=3, **timeouts)
    ids = [backend.enqueue(echo, [i], {}).id for i in range(12)]
    assert {partition_of(task_id) for task_id in ids} == {0, 1, 2}
    backend.heartbeat("box:2:b2", {"type": "worker"}, publish=False)
    while backend.acquire("default", count=12, worker="box:2:b2"):
        pass
    fault_server.down_for(OUTAGE_S)  # Partitions above 0 judge by the heartbeat ages partition 0 gives them.

    assert sorted(once_answered(lambda: backend.live_leases("default", ids))) == sorted(ids)
    assert backend.requeue_many("default", segment="running", task_ids=ids) == []
    assert backend.requeue_matching("default", segment="running") == []

    wait_for(lambda: settled(backend), lambda: f"the server is up {SETTLE_S:g} s", SETTLE_S + SLACK_S)
    assert backend.live_leases("default", ids) == []
    assert sorted(backend.requeue_many("default", segment="running", task_ids=ids)) == sorted(ids)
