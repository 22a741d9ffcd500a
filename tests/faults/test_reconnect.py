"""A server restarted or a connection reset, and the server back: the first call on every kept connection succeeds.

The backend keeps one script connection per thread (and per node on a cluster), and the
asyncio path one pool per event loop. A connection the server closed while it sat idle is
replaced when it is next used instead of failing that call: otherwise a web process answers
its first request on each thread with an error after every restart or failover. Only a call
made while the server really is down fails. No task runs here, so what is counted is what
the server stores: each enqueue exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tests.faults.conftest import FaultServer, fault_backend, wait_for
from tests.tasks import echo
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import ServerUnreachable

#: Seconds a restarted server may take to answer a fresh client, and a call to return.
TIMEOUT_S = 10.0


def answers(url: str) -> bool:
    """Whether a fresh client's PING is answered now."""
    with redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1) as client:
        return client.ping()


def wait_until_back(server: FaultServer) -> None:
    wait_for(lambda: answers(server.url), lambda: f"the server on {server.url} answers a fresh client", TIMEOUT_S)


def reset_connections(port: int) -> int:
    """Close every client connection of the server on `port` but the caller's own (CLIENT KILL); return how many."""
    with redis.Redis(port=port) as client:
        return client.client_kill_filter(_type="normal", skipme=True)


def ready(backend: RedisTaskBackend) -> int:
    return backend.queue_stats()["default"][Segment.READY]


@pytest.fixture
def thread() -> Iterator[Callable]:
    """Run calls on one long-lived thread, as a web server's worker thread makes them: `thread(fn, *args)`."""
    executor = ThreadPoolExecutor(max_workers=1)
    yield lambda fn, *args: executor.submit(fn, *args).result(timeout=TIMEOUT_S)
    executor.shutdown(wait=False)


def test_the_first_calls_after_a_server_restart_succeed_and_a_call_while_it_is_down_fails(fault_server, thread):
    backend = fault_backend(fault_server)
    thread(backend.enqueue, echo, [1], {})
    assert backend.acquire("default", worker="w") != []  # this thread's connection too
    thread(backend.enqueue, echo, [2], {})

    fault_server.restart()
    wait_until_back(fault_server)
    assert thread(backend.enqueue, echo, [3], {}).args == [3]
    [leased] = backend.acquire("default", worker="w")  # the worker's verb, on a thread that had the old connection
    assert leased.args == [2]

    fault_server.stop()
    with pytest.raises(ServerUnreachable, match="Cannot reach the Redis server"):
        thread(backend.enqueue, echo, [4], {})
    fault_server.start()
    wait_until_back(fault_server)
    assert thread(backend.enqueue, echo, [5], {}).args == [5]
    assert (ready(backend), backend.queue_stats()["default"][Segment.RUNNING]) == (2, 2)


async def test_the_first_aenqueue_after_a_server_restart_succeeds_and_one_while_it_is_down_fails(fault_server):
    backend = fault_backend(fault_server)
    await backend.aenqueue(echo, [1], {})

    # In a thread, so the event loop goes on running (as a web server's does) while the server restarts.
    await asyncio.to_thread(fault_server.restart)
    await asyncio.to_thread(wait_until_back, fault_server)
    assert (await backend.aenqueue(echo, [2], {})).args == [2]

    await asyncio.to_thread(fault_server.stop)
    with pytest.raises(ServerUnreachable, match="Cannot reach the Redis server"):
        await backend.aenqueue(echo, [3], {})
    await asyncio.to_thread(fault_server.start)
    await asyncio.to_thread(wait_until_back, fault_server)
    assert (await backend.aenqueue(echo, [4], {})).args == [4]
    assert ready(backend) == 3


def test_the_first_calls_after_the_connections_are_reset_succeed(fault_server, thread):
    backend = fault_backend(fault_server)
    thread(backend.enqueue, echo, [1], {})
    backend.enqueue(echo, [2], {})

    assert reset_connections(fault_server.valkey.port) >= 2
    assert thread(backend.enqueue, echo, [3], {}).args == [3]
    assert len(backend.acquire("default", count=10, worker="w")) == 3


async def test_the_first_aenqueue_after_the_connections_are_reset_succeeds(fault_server):
    backend = fault_backend(fault_server)
    await backend.aenqueue(echo, [1], {})

    # In a thread, so the event loop goes on running and reads the closed socket's end, as a web server's would.
    assert await asyncio.to_thread(reset_connections, fault_server.valkey.port) >= 1
    assert (await backend.aenqueue(echo, [2], {})).args == [2]
    assert ready(backend) == 2


def test_the_first_calls_after_every_cluster_node_reset_its_connections_succeed(cluster, thread):
    backend = RedisTaskBackend("default", cluster.params(QUEUES=["default"], OPTIONS={"partitions": 3}))
    for i in range(3):  # one task per partition: a connection to each primary
        thread(backend.enqueue, echo, [i], {})
    backend.acquire("default", worker="w")

    for node in cluster.server.primary_nodes:
        reset_connections(node.port)
    assert [thread(backend.enqueue, echo, [i], {}).args for i in range(3, 6)] == [[3], [4], [5]]
    assert len(drain(backend)) == 5


def drain(backend: RedisTaskBackend) -> list:
    """Lease every ready task of the queue (one acquire takes from one partition)."""
    leased = []
    while batch := backend.acquire("default", count=10, worker="w"):
        leased += batch
    return leased
