"""SIGTERM while an acquire's reply is on the wire, made certain by a slow link (tests/faults/proxy.py).

The leases that arrive after the stop emptied the buffer go back to ready at once: none is
started, none is dropped, and the process says goodbye only once they are handed back. A
later pool then runs each task once. Counted on the counter server.
"""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace

import pytest
from django.tasks import TaskResultStatus

from tests.faults.conftest import Tally, wait_for
from tests.faults.proxy import Proxy

pytestmark = pytest.mark.slow

#: Added each way on the pool's link: an acquire's reply is on the wire for this long.
LATENCY_S = 0.5
#: Timeouts for a link this slow: a heartbeat's round trip (1 s) stays well inside the trust window.
SLOW_LINK = {"THREADMILL_TEST_WORKER_TIMEOUT": "10", "THREADMILL_TEST_SOCKET_TIMEOUT": "5"}


#: The timing can miss the window (an idle wait timing out at the wrong moment): tries before the test gives up.
ATTEMPTS = 3
#: What the worker logs when the race was hit.
HIT = "leased by a call answered after the stop go back to ready"
#: What the worker process logs once a stop signal has stopped it.
STOPPED = " stopping: "


def _stop_during_an_acquire(tally: Tally, fault_server, start_pool) -> tuple[list[str], bool]:
    """Enqueue tasks to an idle pool behind a slow link and SIGTERM it mid-acquire; return their ids and whether it hit."""
    with Proxy(fault_server.valkey.port) as proxy:
        pool = start_pool(SimpleNamespace(url=proxy.url), "-w", "1", "-t", "2", "--prefetch-count", "8", **SLOW_LINK)
        wait_for(
            lambda: pool.alive() and tally.backend.worker_heartbeats(), lambda: "the pool's heartbeat is stored", 30
        )
        proxy.latency(LATENCY_S)
        # The idle worker's wake token comes back after LATENCY_S, its acquire reaches the server
        # LATENCY_S later, and the reply takes LATENCY_S more: the stop lands in the middle.
        ids = tally.enqueue(20, sleep_ms=5)
        time.sleep(2 * LATENCY_S)  # The moment of the fault, not a synchronisation.
        pool.process.send_signal(signal.SIGTERM)
        # Once the worker process has stopped (it logs so after), the race is decided: a reply that
        # arrives later is one answered after the stop, and what is on the wire keeps its delay.
        # The rest of the stop need not crawl: at LATENCY_S each way its last calls took 13 s more.
        wait_for(
            lambda: STOPPED in pool.output or pool.process.poll() is not None,
            lambda: f"the worker process logs its stop ({pool.output[-2000:]})",
            30,
        )
        proxy.latency(0)
        assert pool.process.wait(60) == 0, pool.output[-3000:]
    assert tally.backend.worker_heartbeats() == {}, "it said goodbye only after handing everything back"
    return ids, HIT in pool.output


def test_leases_answered_after_a_sigterm_go_back_to_ready_and_later_run_once(tally: Tally, fault_server, start_pool):
    for _ in range(ATTEMPTS):
        ids, hit = _stop_during_an_acquire(tally, fault_server, start_pool)
        if hit:
            break
    assert hit, f"the stop never landed while an acquire's reply was on the wire in {ATTEMPTS} tries"
    started = tally.started()
    assert sum(started[task_id] for task_id in ids) == 0, f"tasks started after the stop: {dict(started)}"
    for task_id in ids:
        result = tally.backend.get_result(task_id)
        assert result.status == TaskResultStatus.READY, (task_id, result.status)
        assert result.worker_ids == [] and result.errors == [], (task_id, result.worker_ids)

    later = start_pool(fault_server, "-w", "1", "-t", "2", "--exit-empty")
    wait_for(lambda: later.process.poll() is not None, lambda: f"a later pool drains ({tally.summary()})", 30)
    tally.assert_each_ran_once()
