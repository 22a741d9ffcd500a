"""The server restarted, down or frozen mid-drain: the workers ride it out and nothing is lost or run twice.

The issue's target for each: 0 tasks lost, 0 run twice, 0 marked FAILED, 0 worker
processes restarted, and the drain finishes within seconds of the server's return.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from tests.faults.conftest import KINDS, FaultServer, Tally, fault_backend, wait_for, wait_for_drain

pytestmark = pytest.mark.slow

#: Tasks of 20 ms per drain: about 2 s of work for `-w 1 -t 4`.
TASKS = 400
#: The issue's outage, seconds.
OUTAGE_S = 10.0
#: Seconds the rest of the drain may take once the server is back: the work left plus reconnecting.
AFTER_RETURN_S = 12.0


def _drain_through(fault: Callable[[], None], server: FaultServer, tally: Tally, start_pool) -> float:
    """Break the server with `fault` mid-drain, assert the issue's target, and return the seconds the drain took after it."""
    tally.enqueue(TASKS, sleep_ms=20)
    pool = start_pool(server, "-w", "1", "-t", "4")
    wait_for(lambda: pool.alive() and tally.successful() >= 50, lambda: f"a drain is under way ({tally.summary()})", 30)
    children = pool.children()

    fault()
    back = time.monotonic()

    finished = wait_for_drain(pool, tally, AFTER_RETURN_S, "the drain finishes after the server's return")
    tally.assert_each_ran_once()
    assert pool.children() == children, f"worker processes were replaced: {pool.respawns()}"
    assert pool.respawns() == []
    return finished - back


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_restart_with_appendfsync_always_mid_drain_loses_nothing_and_runs_nothing_twice(
    make_fault_server, counter, start_pool, kind
):
    server = make_fault_server(appendfsync="always", kind=kind)
    tally = Tally(fault_backend(server), counter)

    _drain_through(server.restart, server, tally, start_pool)


def test_a_server_down_for_ten_seconds_mid_drain_loses_nothing_and_runs_nothing_twice(fault_server, tally, start_pool):
    _drain_through(lambda: fault_server.down_for(OUTAGE_S), fault_server, tally, start_pool)


def test_a_server_frozen_for_ten_seconds_mid_drain_loses_nothing_and_runs_nothing_twice(
    fault_server, tally, start_pool
):
    _drain_through(lambda: fault_server.freeze_for(OUTAGE_S), fault_server, tally, start_pool)


def test_a_process_stopped_while_the_server_is_down_is_not_taken_for_one_whose_consumers_died(fault_server, caplog):
    from tests import tasks
    from threadmill.worker.config import WorkerConfig
    from threadmill.worker.process import WorkerProcess

    backend = fault_backend(fault_server, socket_timeout=0.5)
    for _ in range(3):
        backend.enqueue(tasks.sleep_for, [0.3], {})
    config = WorkerConfig(queues=("default",), threads=1, prefetch_count=4, shutdown_timeout=1.0)
    process = WorkerProcess(backend, config, "h:1:stopping")
    process.start()
    wait_for(lambda: process.busy == 1 and len(process.buffer) == 2, lambda: "the first task runs, two wait", 10)

    fault_server.stop()
    process.stop()
    assert process.finished.wait(10), "the stopped process did not finish"

    # Its consumer left because it stopped, with an outcome it could not acknowledge: not a crash.
    assert "Every consumer thread" not in caplog.text
    assert not process.failed and process.exit_code == 0
    assert process.named_on_server, "an unacknowledged outcome is left to the broker, so no goodbye"


def test_progress_reports_that_meet_the_server_down_are_ridden_out_and_written_once_it_is_back(fault_server, caplog):
    import redis

    from tests import tasks
    from threadmill.worker.config import WorkerConfig
    from threadmill.worker.process import WorkerProcess

    backend = fault_backend(fault_server, socket_timeout=0.5)
    go_on = redis.Redis.from_url(os.environ["THREADMILL_TEST_REDIS_URL"])
    go_on.delete("test:report-outage")
    result = backend.enqueue(tasks.report_then_wait, ["test:report-outage"], {})
    config = WorkerConfig(queues=("default",), threads=1, prefetch_count=1, exit_empty=True)
    process = WorkerProcess(backend, config, "h:1:reporting")
    process.start()
    wait_for(lambda: backend.get_result(result.id).progress is not None, lambda: "the first report is stored", 10)

    fault_server.stop()
    go_on.set("test:report-outage", "1")  # the task reports 10 of 10 and ends while the server is down
    wait_for(lambda: "Cannot reach the Redis server" in caplog.text, lambda: "the fetcher meets the outage", 10)
    fault_server.start()

    assert process.finished.wait(30), "the process did not drain once the server was back"
    assert not process.failed and process.exit_code == 0, caplog.text[-2000:]
    stored = backend.get_result(result.id)
    assert stored.status.name == "SUCCESSFUL" and (stored.progress.done, stored.progress.note) == (10, "all done")
