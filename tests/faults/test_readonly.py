"""A primary demoted under its clients (READONLY): connections made before the flip are dropped, not kept.

Two servers, A the primary and B its replica, behind a TCP proxy that stands for a DNS name.
Mid-drain, A hands over to B (`FAILOVER TO`, which pauses writes until B has them all, so
nothing is lost) and the proxy sends new connections to B, as a DNS record flipped to the new
primary would; the connections made before still reach A, now a replica that answers every
write with READONLY. A client that kept such a connection would hear READONLY until it
broke; Threadmill drops it at the first READONLY and the next call connects anew, through the
proxy to B. The pool, its broker and a producer ride this out as through a restart: no process
exits, every task runs once. NOREPLICAS (a primary short of `min-replicas-to-write`) is the
same kind of refusal, ridden out the same way.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from tests import tasks
from tests.faults.conftest import Tally, fault_backend, wait_for, wait_for_drain
from tests.faults.proxy import Proxy
from threadmill.exceptions import ServerUnreachable

pytestmark = pytest.mark.slow

#: Tasks of 10 ms in the drain, and tasks a producer enqueues after the flip.
TASKS = 200
AFTER_FLIP = 30
#: Seconds the drain may take after the flip.
AFTER_FLIP_S = 30.0


def replicating(replica_port: int, primary_port: int) -> bool:
    with redis.Redis(port=replica_port, decode_responses=True) as client:
        client.execute_command("REPLICAOF", "127.0.0.1", str(primary_port))
        return True


def in_sync(replica_port: int) -> bool:
    with redis.Redis(port=replica_port, decode_responses=True) as client:
        return client.info("replication").get("master_link_status") == "up"


def role(port: int) -> str:
    with redis.Redis(port=port, decode_responses=True) as client:
        return client.info("replication")["role"]


@pytest.fixture
def a_and_b(make_fault_server):
    """A primary and its replica, in sync."""
    primary, replica = make_fault_server(), make_fault_server()
    replicating(replica.valkey.port, primary.valkey.port)
    wait_for(lambda: in_sync(replica.valkey.port), lambda: "the replica is in sync", 10)
    return primary, replica


@pytest.fixture
def proxy(a_and_b):
    with Proxy(a_and_b[0].valkey.port, name="dns") as forwarding:
        yield forwarding


def flip(primary, replica, proxy: Proxy) -> None:
    """Hand A's role to B without losing a write, then point the "DNS name" at B."""
    with redis.Redis(port=primary.valkey.port) as client:
        client.execute_command("FAILOVER", "TO", "127.0.0.1", str(replica.valkey.port), "TIMEOUT", "5000")
    wait_for(lambda: role(replica.valkey.port) == "master", lambda: "B is promoted", 10)
    wait_for(lambda: role(primary.valkey.port) == "slave", lambda: "A is demoted", 10)
    proxy.point_at(replica.valkey.port)


def test_a_demoted_primary_s_readonly_drops_the_connection_and_the_drain_goes_on_on_the_new_one(
    a_and_b, proxy, counter, start_pool
):
    primary, replica = a_and_b
    tally = Tally(fault_backend(proxy, enqueue_retry=20), counter)
    tally.enqueue(TASKS, sleep_ms=10)
    pool = start_pool(proxy, "-w", "1", "-t", "4")
    wait_for(lambda: pool.alive() and tally.successful() >= 30, lambda: f"a drain is under way ({tally.summary()})", 30)

    flip(primary, replica, proxy)
    assert tally.successful() < TASKS, "the drain ended before the flip: nothing was tested"
    # The producer's kept connection reaches A: its first write hears READONLY and is sent again to B.
    tally.enqueue(AFTER_FLIP, sleep_ms=10)

    wait_for_drain(pool, tally, AFTER_FLIP_S, "the drain finishes on B")
    tally.assert_each_ran_once()
    assert pool.respawns() == []
    with redis.Redis(port=replica.valkey.port) as on_b:
        assert on_b.dbsize() > 0  # what ran after the flip was stored on B


async def test_the_asyncio_path_drops_a_connection_that_heard_readonly(a_and_b, proxy):
    primary, replica = a_and_b
    backend = fault_backend(proxy, enqueue_retry=20)
    before = await backend.aenqueue(tasks.echo, ["before"], {})  # the loop's connection now reaches A
    await asyncio.to_thread(flip, primary, replica, proxy)
    after = await backend.aenqueue(tasks.echo, ["after"], {})
    with redis.Redis(port=replica.valkey.port) as on_b:
        assert on_b.exists(backend.task_keys(after.id).task(after.id)) == 1
        assert on_b.exists(backend.task_keys(before.id).task(before.id)) == 1  # FAILOVER handed it over


def test_the_command_layer_s_pool_drops_a_connection_that_heard_readonly(a_and_b, proxy):
    primary, replica = a_and_b
    backend = fault_backend(proxy)
    backend.client.set("threadmill-test:written", "on A")  # the pool keeps this connection to A
    flip(primary, replica, proxy)
    with pytest.raises(redis.exceptions.ReadOnlyError):
        backend.client.set("threadmill-test:written", "refused by A")  # never sent twice: the caller decides
    backend.client.set("threadmill-test:written", "on B")  # the next call connects anew, through the proxy to B
    with redis.Redis(port=replica.valkey.port) as on_b:
        assert on_b.get("threadmill-test:written") == b"on B"


def test_noreplicas_drops_the_connection_and_is_retried_as_an_outage_until_the_replicas_are_there(fault_server):
    backend = fault_backend(fault_server, enqueue_retry=0.3)
    backend.enqueue(tasks.echo, ["before"], {})
    admin = redis.Redis(port=fault_server.valkey.port)
    admin.config_set("min-replicas-to-write", 1)  # no replica: every write is refused with NOREPLICAS
    try:
        with pytest.raises(ServerUnreachable, match=r"gave up after trying .*cannot take writes now.*NOREPLICAS"):
            backend.enqueue(tasks.echo, ["refused"], {})
        assert not backend.scripts.transport.connection()._sock, "the connection that heard NOREPLICAS is dropped"
    finally:
        admin.config_set("min-replicas-to-write", 0)
    assert backend.enqueue(tasks.echo, ["after"], {}).status.name == "READY"
