"""SIGTERM while an acquire's reply is on the wire, made certain by a slow link (tests/faults/proxy.py).

The leases that arrive after the stop emptied the buffer go back to ready at once: none is
started, none is dropped, and the process says goodbye only once they are handed back. A
later pool then runs each task once. Counted on the counter server.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.faults.conftest import Tally, wait_for
from tests.faults.proxy import Proxy
from threadmill.backends.base import Segment

pytestmark = pytest.mark.slow

#: Added each way on the pool's link: an acquire's reply is on the wire for this long.
LATENCY_S = 0.5
#: Timeouts for a link this slow: a heartbeat's round trip (1 s) stays well inside the trust window.
SLOW_LINK = {"THREADMILL_TEST_WORKER_TIMEOUT": "10", "THREADMILL_TEST_SOCKET_TIMEOUT": "5"}


def test_leases_answered_after_a_sigterm_go_back_to_ready_and_later_run_once(tally: Tally, fault_server, start_pool):
    with Proxy(fault_server.valkey.port) as proxy:
        pool = start_pool(SimpleNamespace(url=proxy.url), "-w", "1", "-t", "2", "--prefetch-count", "8", **SLOW_LINK)
        wait_for(
            lambda: pool.alive() and tally.backend.worker_heartbeats(), lambda: "the pool's heartbeat is stored", 30
        )
        proxy.latency(LATENCY_S)
        # The idle worker's wake token comes back after LATENCY_S, its acquire reaches the server
        # LATENCY_S later, and the reply takes LATENCY_S more: the stop lands in the middle.
        tally.enqueue(20, sleep_ms=5)
        time.sleep(2 * LATENCY_S)  # The moment of the fault, not a synchronisation.
        assert pool.stop() == 0, pool.output[-3000:]

    assert "leased by a call answered after the stop go back to ready" in pool.output, pool.output[-3000:]
    assert sum(tally.started().values()) == 0, f"tasks started after the stop: {dict(tally.started())}"
    assert tally.segments()[Segment.READY] == len(tally.ids), tally.summary()
    for task_id in tally.ids:
        result = tally.backend.get_result(task_id)
        assert result.worker_ids == [] and result.errors == [], (task_id, result.worker_ids)
    assert tally.backend.worker_heartbeats() == {}, "it said goodbye only after handing everything back"

    later = start_pool(fault_server, "-w", "1", "-t", "2", "--exit-empty")
    wait_for(lambda: later.process.poll() is not None, lambda: f"a later pool drains ({tally.summary()})", 30)
    tally.assert_each_ran_once()
