"""One shard of a cluster frozen with `partitions` 3: the broker goes on serving the partitions on the others.

Each of the three partitions lives on its own primary of the session's Valkey Cluster. One
primary is frozen (SIGSTOP) for less than the cluster's node timeout, so the cluster does not
count it failed and the other primaries go on answering: the mover, the reaper, the schedules
and the operators' commands must go on for every partition but the frozen one's, while the
broker still reports the outage. No task runs here: what is checked is where each task is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests.cluster import NODE_TIMEOUT_MS
from tests.faults.conftest import wait_for
from tests.tasks import echo
from threadmill.backends.broker import RedisBroker
from threadmill.backends.keys import KeySchema
from threadmill.backends.partitions import partition_of
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import ServerUnreachable

#: The partition whose primary is frozen: not 0, which holds the heartbeats, schedules and commands.
FROZEN = 1
#: Seconds of a script call to the frozen primary before it gives up.
SOCKET_TIMEOUT_S = 0.5
#: Longest a freeze may last: well inside the node timeout, after which the cluster counts the node failed.
FREEZE_LIMIT_S = NODE_TIMEOUT_MS / 1000 - 1.5


@contextlib.contextmanager
def frozen(cluster, partition: int) -> Iterator[None]:
    """Freeze (SIGSTOP) the primary holding `partition`; thaw it and wait until the cluster says it is fine."""
    node = cluster.server.node_for(KeySchema("default", partition).prefix)
    os.kill(node.process.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        yield
    finally:
        os.kill(node.process.pid, signal.SIGCONT)
        assert time.monotonic() - frozen_at < FREEZE_LIMIT_S, "the freeze outlasted its bound: the test proves nothing"
        with redis.Redis(port=node.port, decode_responses=True) as client:
            wait_for(lambda: client.cluster("info")["cluster_state"] == "ok", lambda: "the cluster is fine again", 10)


def one_per_partition(backend: RedisTaskBackend, **using) -> dict[int, str]:
    """Enqueue an echo task in each partition (enqueue takes them in turn); return partition -> task id."""
    ids = {}
    while len(ids) < 3:
        result = backend.enqueue(echo.using(**using) if using else echo, [len(ids)], {})
        ids.setdefault(partition_of(result.id), result.id)
    return ids


def segments(backend: RedisTaskBackend, ids: dict[int, str], partitions) -> list[Segment]:
    """The segments of the tasks of `ids` in `partitions` (reading the frozen one's would wait for it)."""
    return [backend.get_result(ids[partition]).segment for partition in partitions]


def test_a_broker_pass_serves_every_partition_but_the_one_on_a_frozen_primary(cluster):
    backend = RedisTaskBackend(
        "default",
        cluster.params(
            QUEUES=["default"],
            OPTIONS={"partitions": 3, "lease_ttl": 0.3, "socket_timeout": SOCKET_TIMEOUT_S},
            SCHEDULE={"nightly": {"task": "tests.tasks.echo", "cron": "0 3 * * *"}},
        ),
    )
    broker = RedisBroker(backend, ["default"])
    leased = one_per_partition(backend)
    leases = []
    while batch := backend.acquire("default", count=3, worker="h:1"):
        leases += batch
    deferred = one_per_partition(backend, run_after=datetime.now(UTC) - timedelta(seconds=1))
    lease_end = max(lease.lease_deadline for lease in leases)
    wait_for(lambda: backend.server_time() > lease_end, lambda: "every lease ran out on the server's clock", 5)

    with frozen(cluster, FROZEN):
        started = time.monotonic()
        skipped = r"; the pass skipped partition\(s\) 1 of 3 and served the others\.$"
        with pytest.raises(ServerUnreachable, match=skipped):
            broker.run_once()
        took = time.monotonic() - started
        live = [p for p in range(3) if p != FROZEN]
        assert segments(backend, deferred, live) == [Segment.READY] * 2  # the mover
        assert segments(backend, leased, live) == [Segment.FAILED] * 2  # the reaper
        assert backend.schedule_states()["nightly"]["last_tick"] is not None  # the schedules, on partition 0
        assert broker.failed_partitions == {FROZEN}
    # One wait on the frozen primary, not one a partition and duty.
    assert took < 4 * SOCKET_TIMEOUT_S + 1

    # Thawed, the primary may run the promote it was sent while frozen before the next pass does.
    broker.run_once()
    assert broker.failed_partitions == set()
    assert segments(backend, deferred, [FROZEN]) == [Segment.READY]
    assert segments(backend, leased, [FROZEN]) == [Segment.FAILED]


def test_every_pass_during_a_freeze_waits_out_one_socket_timeout_on_the_frozen_primary(cluster):
    backend = RedisTaskBackend(
        "default", cluster.params(QUEUES=["default"], OPTIONS={"partitions": 3, "socket_timeout": SOCKET_TIMEOUT_S})
    )
    broker = RedisBroker(backend, ["default"])
    broker.run_once()
    took = []
    with frozen(cluster, FROZEN):
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(ServerUnreachable):
                broker.run_once()
            took.append(time.monotonic() - started)
            assert broker.failed_partitions == {FROZEN}
    # The second and later passes once waited 2-4 timeouts: a new connection to the hung node was
    # tried twice, and the slot map reloaded after each failure could be asked of that node first.
    assert max(took) < 1.8 * SOCKET_TIMEOUT_S, took


def test_recovery_takes_back_a_dead_workers_leases_on_every_partition_but_the_one_on_a_frozen_primary(cluster):
    backend = RedisTaskBackend(
        "default",
        cluster.params(QUEUES=["default"], OPTIONS={"partitions": 3, "worker_timeout": 2, "socket_timeout": 0.5}),
    )
    broker = RedisBroker(backend, ["default"])
    broker._reachable_since = float("-inf")  # it has reached partition 0 long enough to trust the heartbeats
    leased = one_per_partition(backend)
    while backend.acquire("default", count=3, worker="h:dead"):
        pass
    backend.heartbeat("h:dead", {"type": "worker"})
    seconds, micros = backend.client_for(backend.keys.workers()).time()
    backend.client.zadd(backend.keys.workers(), {"h:dead": seconds + micros / 1e6 - 3})  # silent for 3 s

    with frozen(cluster, FROZEN):
        with pytest.raises(ServerUnreachable):
            broker.run_once()
        live = [p for p in range(3) if p != FROZEN]
        assert segments(backend, leased, live) == [Segment.READY] * 2
    assert broker.run_once() == (0, 1)
    assert segments(backend, leased, [FROZEN]) == [Segment.READY]


def test_an_operators_command_is_carried_out_while_another_partitions_primary_is_frozen(cluster, start_pool):
    backend = RedisTaskBackend("default", cluster.params(QUEUES=["default"], OPTIONS={"partitions": 3}))
    pool = start_pool(cluster, "-w", "1", THREADMILL_TEST_CLUSTER="1", THREADMILL_TEST_PARTITIONS="3")
    [worker] = wait_for(
        lambda: pool.alive() and [doc["worker"] for doc in backend.live_workers()], lambda: "the worker beats", 15
    )

    with frozen(cluster, FROZEN):
        backend.send_control([worker], "quiet", by="test")
        wait_for(
            lambda: pool.alive() and backend.pending_control() == {},
            lambda: f"the pool takes the command ({backend.pending_control()})",
            FREEZE_LIMIT_S - 1,
        )
    wait_for(lambda: "An operator quiets worker process" in pool.output, lambda: "the pool logs the command", 5)
