"""A Sentinel-watched primary killed mid-drain: the sentinels promote its replica and everything follows.

The set is the test's own (tests/sentinel.py: one primary, one replica, three sentinels, a
primary silent for 1 s counts as down). Every task is enqueued with `wait_replicas` 1, so the
replica holds all of them before the kill: none may be lost. The pool, the broker inside it,
a producer enqueueing through the failover and the console's telemetry hub all reach the
primary through the sentinels, each connection asking when it connects, so each ends up on
the promoted replica without a process exiting. As on a cluster, the last writes of the drain
(a lease, an acknowledgement) that the replica had not yet received may be lost: such a task
runs once more, bounded by what the pool held at the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from django.tasks import task_backends

from tests import tasks
from tests.faults.conftest import Tally, wait_for, wait_for_drain
from tests.sentinel import SentinelSet
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment

pytestmark = pytest.mark.slow

#: Tasks of 20 ms in the drain, and tasks a producer enqueues while the primary is down.
TASKS = 300
DURING_FAILOVER = 40
#: Worker threads of the pool, and the tasks it may lease ahead of them (its prefetch).
THREADS = 4
PREFETCH = 4
#: Longest the promotion may take: down-after 1 s, the vote, the replica's promotion.
PROMOTION_TIMEOUT_S = 20.0
#: Lease of the pool: a task whose acknowledgement the failover lost runs again once it expires.
LEASE_TTL_S = 5
#: Seconds the drain may take after the promotion.
AFTER_PROMOTION_S = 40.0


@pytest.fixture
def sentinel_set():
    sentinels = SentinelSet(down_after_ms=1000, failover_timeout_ms=3000).start()
    yield sentinels
    sentinels.stop()


@pytest.fixture
def on_sentinel(sentinel_set, settings) -> RedisTaskBackend:
    """This process's `default` backend (the tooling API's and the console's) through the sentinels."""
    options = {"lease_ttl": LEASE_TTL_S, "socket_timeout": 1, "wait_replicas": 1, "worker_timeout": 2}
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": sentinel_set.url, "OPTIONS": options}}
    return task_backends["default"]


@pytest.fixture
def stack():
    with contextlib.ExitStack() as resources:
        yield resources


@pytest.fixture
def hub(on_sentinel, monkeypatch):
    """A telemetry hub of the test's own as this process's hub, subscribed through the sentinels."""
    from threadmill.api import workers

    hub = workers.TelemetryHub()
    monkeypatch.setattr(workers, "_hub", hub)
    yield hub.start()
    hub.stop()


def heard_since(hub, moment: float) -> bool:
    return any(worker.last_seen > moment for worker in hub.workers())


def test_a_primary_killed_mid_drain_is_replaced_through_sentinel_and_every_task_runs(
    sentinel_set, on_sentinel, counter, start_pool, hub, stack
):
    tally = Tally(on_sentinel, counter)
    tally.enqueue(TASKS, sleep_ms=20)
    pool = start_pool(
        sentinel_set,
        *("-w", "1", "-t", str(THREADS), "--prefetch-count", str(PREFETCH)),
        THREADMILL_TEST_LEASE_TTL=str(LEASE_TTL_S),
    )
    wait_for(lambda: pool.alive() and tally.successful() >= 50, lambda: f"a drain is under way ({tally.summary()})", 30)
    wait_for(lambda: heard_since(hub, 0), lambda: "the console's hub hears the pool", 10)

    # A producer, sync and on an event loop, connected to the primary before it dies.
    producer = RedisTaskBackend(
        "default", {"REDIS_URL": sentinel_set.url, "OPTIONS": {"socket_timeout": 1, "enqueue_retry": 30}}
    )
    loop = stack.enter_context(asyncio.Runner())
    tally.ids += [producer.enqueue(tasks.count_run, [], {}).id, loop.run(producer.aenqueue(tasks.count_run, [], {})).id]

    replica_port = next(s.port for s in sentinel_set.servers if s.port != sentinel_set.primary_port())
    finished_before = set(tally.finished())
    sentinel_set.kill_primary()  # SIGKILL: no goodbye to the replica or the sentinels
    killed = time.monotonic()
    assert len(finished_before) < TASKS, "the drain ended before the kill: nothing was tested"

    # The producer goes on enqueueing while the primary is down: each call rides the failover out.
    tally.ids += [producer.enqueue(tasks.count_run, [], {}).id for _ in range(DURING_FAILOVER)]
    tally.ids += [loop.run(producer.aenqueue(tasks.count_run, [], {})).id for _ in range(DURING_FAILOVER // 4)]

    wait_for(
        lambda: sentinel_set.primary_port() == replica_port,
        lambda: f"the sentinels promote the replica on port {replica_port}",
        PROMOTION_TIMEOUT_S,
    )
    promoted = time.monotonic()
    wait_for_drain(pool, tally, AFTER_PROMOTION_S, "the drain finishes on the promoted replica")
    drained = time.monotonic()
    wait_for(lambda: heard_since(hub, time.time() - 1), lambda: "the console's hub hears the pool again", 15)

    twice = tally.ran_twice()
    print(
        f"\nsentinel failover: promoted {promoted - killed:.1f} s after the kill, drained {drained - promoted:.1f} s "
        f"later; {len(tally.ids)} enqueued ({DURING_FAILOVER + DURING_FAILOVER // 4} during the failover, sync and asyncio), {len(finished_before)} finished "
        f"before the kill, {len(tally.never_ran())} lost, {len(twice)} ran twice; hub lost its subscription "
        f"{hub.losses} times"
    )
    assert tally.never_ran() == [], tally.summary()
    assert tally.segments()[Segment.FAILED] == 0, tally.summary()
    assert len(twice) <= THREADS + PREFETCH, tally.summary()
    assert max(twice.values(), default=1) <= 2, twice
    assert pool.respawns() == []
    assert hub.losses >= 1, "the hub's subscription was on the killed primary: it must have been lost"
    # The pool lost the server and found it again without a restart, which is what the kill tested.
    assert "The server answers again after" in pool.output, pool.output[-4000:]
