"""Enqueue rides out a blip (`enqueue_retry`): a restart under load, a budget shorter than the outage, a lost reply.

The server is really killed, stopped or cut off; what it holds afterwards is read from it and
compared with what the calls returned.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Self
from urllib.parse import urlsplit

import pytest
import redis
from django.tasks.signals import task_enqueued

from tests import tasks
from tests.cluster import ValkeyCluster
from tests.faults.conftest import FaultServer, fault_backend, wait_for
from tests.faults.proxy import Proxy
from tests.faults.test_failover import ALIAS_KEY, is_primary, replica_of
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import ServerUnreachable

#: Tasks of one `enqueue_many` call in the load.
BULK = 10


@pytest.fixture
def enqueued_signals() -> Iterator[Counter]:
    """Count `task_enqueued` per task id while the test runs."""
    sent: Counter = Counter()

    def count(sender, task_result, **kwargs):
        sent[task_result.id] += 1

    task_enqueued.connect(count)
    yield sent
    task_enqueued.disconnect(count)


class Load:
    """Four threads enqueueing until stopped: two single, one bulk, one asyncio; each call's outcome kept."""

    def __init__(self, backend: RedisTaskBackend) -> None:
        self.backend = backend
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.returned: list[str] = []
        #: (seconds the call took, the error) of each call that raised.
        self.raised: list[tuple[float, Exception]] = []
        #: Seconds the longest call that returned took: the outage as a caller saw it.
        self.longest_s = 0.0
        self.threads = [
            threading.Thread(target=self._loop, args=(self._single,), name="single-1"),
            threading.Thread(target=self._loop, args=(self._single,), name="single-2"),
            threading.Thread(target=self._loop, args=(self._bulk,), name="bulk"),
            threading.Thread(target=lambda: asyncio.run(self._async_loop()), name="asyncio"),
        ]

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _single(self) -> list[str]:
        return [self.backend.enqueue(tasks.echo, [1], {}).id]

    def _bulk(self) -> list[str]:
        return [r.id for r in self.backend.enqueue_many(tasks.echo, [([i], {}) for i in range(BULK)])]

    def _loop(self, call: Callable[[], list[str]]) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                ids = call()
            except ServerUnreachable as e:
                self._record([], time.monotonic() - began, e)
            else:
                self._record(ids, time.monotonic() - began, None)

    async def _async_loop(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                result = await self.backend.aenqueue(tasks.echo, [1], {})
            except ServerUnreachable as e:
                self._record([], time.monotonic() - began, e)
            else:
                self._record([result.id], time.monotonic() - began, None)

    def _record(self, ids: list[str], took_s: float, error: Exception | None) -> None:
        with self.lock:
            self.returned += ids
            if error is not None:
                self.raised.append((took_s, error))
            else:
                self.longest_s = max(self.longest_s, took_s)

    def count(self) -> int:
        with self.lock:
            return len(self.returned)


def stored_ids(backend: RedisTaskBackend, url: str = "") -> list[str]:
    """Every task id the server (at `url`, else the backend's) holds in the default queue's ready segment."""
    client = redis.Redis.from_url(url or backend.redis_url)
    return [member.decode() for member in client.zrange(backend.keys.segment("default", Segment.READY), 0, -1)]


def task_hashes(backend: RedisTaskBackend, url: str = "") -> int:
    client = redis.Redis.from_url(url or backend.redis_url)
    return sum(1 for _ in client.scan_iter(match=backend.keys.task_prefix() + "*", count=1000))


def enqueued_more_than(load: Load, count: int) -> Callable[[], bool]:
    return lambda: load.count() > count


def test_enqueue_rides_out_a_kill_and_restart_without_raising_or_storing_twice(make_fault_server, enqueued_signals):
    # appendfsync always: a kill -9 keeps every write the server answered, so each returned id must be there.
    server: FaultServer = make_fault_server("always")
    backend = fault_backend(server, socket_timeout=1)
    with Load(backend) as load:
        for _ in range(2):
            wait_for(enqueued_more_than(load, load.count() + 50), lambda: "the load enqueues", 10)
            server.kill9_and_restart()
        wait_for(enqueued_more_than(load, load.count() + 50), lambda: "the load enqueues after the restart", 10)
    print(f"\nkill -9 and restart: {len(load.returned)} tasks, the longest call {load.longest_s:.2f} s")
    assert load.raised == []
    stored = stored_ids(backend)
    assert Counter(stored) == Counter(load.returned)
    assert task_hashes(backend) == len(load.returned)
    assert set(enqueued_signals) == set(load.returned)
    assert set(enqueued_signals.values()) == {1}
    assert backend.totals()["default"]["enqueue_retries"] > 0
    assert backend.totals()["default"]["enqueued"] == len(load.returned)


def test_enqueue_raises_after_a_budget_shorter_than_the_outage_and_every_returned_task_exists(
    fault_server, enqueued_signals
):
    backend = fault_backend(fault_server, socket_timeout=1, enqueue_retry=0.5)
    with Load(backend) as load:
        wait_for(enqueued_more_than(load, 50), lambda: "the load enqueues", 10)
        fault_server.down_for(2.0)
        wait_for(enqueued_more_than(load, load.count() + 50), lambda: "the load enqueues after the outage", 10)
    assert load.raised, "no call raised during an outage four times the budget"
    for took_s, error in load.raised:
        assert "gave up after trying for" in str(error)
        assert "enqueue_retry is 0.5 s" in str(error)
        assert took_s >= 0.5
    assert set(load.returned) <= set(stored_ids(backend))
    assert set(enqueued_signals) == set(load.returned)


@pytest.fixture
def proxy(fault_server) -> Iterator[Proxy]:
    with Proxy(urlsplit(fault_server.url).port) as running:
        yield running


def backend_through(proxy: Proxy, **options) -> RedisTaskBackend:
    return RedisTaskBackend(
        "default", {"REDIS_URL": proxy.url, "OPTIONS": {"lease_ttl": 60, "socket_timeout": 1, **options}}
    )


@pytest.mark.parametrize("fsync_enqueue", [False, True])
def test_an_enqueue_whose_reply_was_lost_is_retried_and_stores_its_task_once(proxy, enqueued_signals, fsync_enqueue):
    backend = backend_through(proxy, fsync_enqueue=fsync_enqueue)
    backend.enqueue(tasks.echo, [0], {})  # connects (and checks the append-only file) before the fault
    proxy.lose_replies(1)
    result = backend.enqueue(tasks.echo, [1], {})
    assert stored_ids(backend).count(result.id) == 1
    assert backend.get_result(result.id).args == [1]
    assert task_hashes(backend) == 2
    assert enqueued_signals[result.id] == 1
    totals = backend.totals()["default"]
    assert (totals["enqueued"], totals["enqueue_retries"], totals["already_stored"]) == (2, 1, 1)


def test_an_enqueue_many_batch_whose_reply_was_lost_stores_each_task_once(proxy, enqueued_signals):
    backend = backend_through(proxy)
    first = backend.enqueue(tasks.echo, [0], {})
    proxy.lose_replies(1)
    results = backend.enqueue_many(tasks.echo, [([i], {}) for i in range(5)])
    assert Counter(stored_ids(backend)) == Counter([first.id] + [r.id for r in results])
    assert task_hashes(backend) == 6
    assert all(enqueued_signals[r.id] == 1 for r in results)
    totals = backend.totals()["default"]
    assert (totals["enqueued"], totals["enqueue_retries"], totals["already_stored"]) == (6, 1, 5)


def test_a_unique_task_whose_reply_was_lost_is_not_its_own_duplicate(proxy, enqueued_signals):
    backend = backend_through(proxy)
    backend.enqueue(tasks.echo, [0], {})
    proxy.lose_replies(1)
    result = backend.enqueue(tasks.unique_echo, [1], {})
    # The first attempt stored it and took its key; the retry finds its own id holding the key.
    assert result.duplicate is False
    assert stored_ids(backend).count(result.id) == 1 and task_hashes(backend) == 2
    assert enqueued_signals[result.id] == 1
    again = backend.enqueue(tasks.unique_echo, [1], {})
    assert again.duplicate is True and again.id == result.id
    assert backend.totals()["default"]["already_stored"] == 1


def test_an_aenqueue_whose_reply_was_lost_stores_its_task_once(proxy, enqueued_signals):
    backend = backend_through(proxy)

    async def enqueue_twice():
        await backend.aenqueue(tasks.echo, [0], {})
        proxy.lose_replies(1)
        return await backend.aenqueue(tasks.echo, [1], {})

    result = asyncio.run(enqueue_twice())
    assert stored_ids(backend).count(result.id) == 1
    assert task_hashes(backend) == 2
    assert enqueued_signals[result.id] == 1
    totals = backend.totals()["default"]
    assert (totals["enqueued"], totals["enqueue_retries"], totals["already_stored"]) == (2, 1, 1)


def test_enqueue_retry_0_raises_at_the_first_failure_as_before(proxy):
    backend = backend_through(proxy, enqueue_retry=0)
    backend.enqueue(tasks.echo, [0], {})
    proxy.lose_replies(1)
    with pytest.raises(ServerUnreachable, match=r"^Cannot reach the Redis server: "):
        backend.enqueue(tasks.echo, [1], {})
    assert task_hashes(backend) == 2


@pytest.fixture
def failover_cluster() -> Iterator[ValkeyCluster]:
    """A replicated cluster of this test's own, node timeout 1 s: the test kills one of its primaries."""
    cluster = ValkeyCluster(replicas_per_primary=1, node_timeout_ms=1000).start()
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        shutil.rmtree(node.data_dir, ignore_errors=True)


@pytest.mark.slow
def test_enqueue_rides_out_a_cluster_failover_without_raising_or_storing_twice(failover_cluster, enqueued_signals):
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": failover_cluster.url, "CLUSTER": True, "OPTIONS": {"socket_timeout": 1}}
    )
    primary = failover_cluster.node_for(ALIAS_KEY)
    replica = replica_of(failover_cluster, primary)
    with Load(backend) as load:
        wait_for(enqueued_more_than(load, 50), lambda: "the load enqueues", 10)
        primary.process.kill()  # SIGKILL: the cluster's own failure detection promotes the replica
        primary.process.wait()
        killed = time.monotonic()
        wait_for(lambda: is_primary(replica), lambda: f"the replica on port {replica.port} is promoted", 15)
        promoted = time.monotonic()
        wait_for(enqueued_more_than(load, load.count() + 50), lambda: "the load enqueues after the failover", 10)
    stored = stored_ids(backend, replica.url)
    # Asynchronous replication: a write the primary answered just before the kill may not have
    # reached its replica (wait_replicas closes that gap, but leaves no replica to confirm after).
    missing = set(load.returned) - set(stored)
    print(
        f"\nfailover: promoted {promoted - killed:.1f} s after the kill; {len(load.returned)} tasks, "
        f"the longest call {load.longest_s:.2f} s, {len(missing)} lost by asynchronous replication"
    )
    assert load.raised == []
    assert sorted(set(stored)) == sorted(stored) and set(stored) <= set(load.returned)
    assert task_hashes(backend, replica.url) == len(stored)
    assert len(missing) <= 4 * BULK
    assert set(enqueued_signals) == set(load.returned)
    assert set(enqueued_signals.values()) == {1}
    assert backend.totals()["default"]["enqueue_retries"] > 0


def test_enqueue_waits_through_readonly_until_its_replica_server_is_promoted(make_fault_server):
    # A failover without a cluster (Sentinel, an operator): the address enqueues go to still
    # names a replica, which answers READONLY until it is made the primary.
    primary, replica = make_fault_server(), make_fault_server()
    control = redis.Redis.from_url(replica.url)
    control.replicaof("127.0.0.1", primary.valkey.port)
    backend = fault_backend(replica, socket_timeout=1)
    stored = {}
    enqueuing = threading.Thread(target=lambda: stored.update(result=backend.enqueue(tasks.echo, [1], {})))
    enqueuing.start()
    wait_for(
        lambda: control.info("errorstats").get("errorstat_READONLY", {}).get("count", 0) > 0,
        lambda: "the replica refuses the enqueue with READONLY",
        5,
    )
    control.replicaof("NO", "ONE")
    enqueuing.join(10)
    assert stored["result"].id in stored_ids(backend)
    assert backend.totals()["default"]["enqueue_retries"] >= 1
