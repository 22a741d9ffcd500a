"""`CLUSTER = True` on a real Valkey Cluster: routing by slot, redirections, sharded telemetry, fsync."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from redis.cluster import RedisCluster

from tests.backends.conftest import finish
from tests.tasks import echo
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import ServerUnreachable

#: A key of the alias's slot (every key of the alias carries its hash tag).
TAGGED = "threadmill:{default}"
CHANNEL = "threadmill:{default}:telemetry"


@pytest.fixture
def backend(cluster) -> RedisTaskBackend:
    return RedisTaskBackend("default", cluster.params(QUEUES=["default"]))


def _script_calls(node) -> tuple[int, int]:
    """Return a node's EVALSHA and EVAL calls so far."""
    with redis.Redis(port=node.port) as client:
        stats = client.info("commandstats")
    return tuple(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


@pytest.fixture
def slot_back_home(cluster):
    """Put the alias's slot back on its first owner after a test moved it (emptied first: a slot moves empty)."""
    home = cluster.server.node_for(TAGGED)
    yield home
    if cluster.server.node_for(TAGGED) is not home:
        cluster.flush()
        cluster.server.move_slot(TAGGED, home)


def test_cluster_must_be_a_bool():
    with pytest.raises(ImproperlyConfigured) as caught:
        RedisTaskBackend("default", {"REDIS_URL": "redis://127.0.0.1:1/0", "CLUSTER": "yes"})
    assert str(caught.value) == "TASKS['default']['CLUSTER'] must be True or False, not 'yes'."


def test_cluster_defaults_to_a_single_server_client(redis_url):
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url})
    assert backend.cluster is False
    assert type(backend.client) is redis.Redis


def test_an_unreachable_cluster_is_server_unreachable_naming_the_url():
    backend = RedisTaskBackend("default", {"REDIS_URL": "redis://127.0.0.1:1/0", "CLUSTER": True})
    with pytest.raises(ServerUnreachable) as caught:
        backend.enqueue(echo, ["x"], {})
    assert str(caught.value).startswith("Cannot reach the Redis Cluster at redis://127.0.0.1:1/0: ")


def test_cluster_on_a_server_that_is_not_a_cluster_says_so(redis_url):
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, "CLUSTER": True})
    with pytest.raises(ServerUnreachable) as caught:
        backend.ping()
    message = str(caught.value)
    assert message.startswith(f"Cannot reach the Redis Cluster at {redis_url}: ")
    assert message.endswith("Cluster mode is not enabled on this node")


def test_every_script_call_runs_on_the_primary_that_owns_the_aliases_slot(cluster, backend):
    owner = cluster.server.node_for(TAGGED)

    def one_round():
        result = backend.enqueue(echo, ["hello"], {})
        (leased,) = backend.acquire("default", worker="w:1")
        assert finish(backend, leased, "done")
        return result

    one_round()  # a node new to a script refuses its EVALSHA (NOSCRIPT); an EVAL runs and caches it
    before = {node.port: _script_calls(node) for node in cluster.server.primary_nodes}
    result = one_round()
    after = {node.port: _script_calls(node) for node in cluster.server.primary_nodes}
    assert isinstance(backend.client, RedisCluster)
    assert {port: (after[port][0] - before[port][0], after[port][1] - before[port][1]) for port in after} == {
        node.port: (3, 0) if node is owner else (0, 0) for node in cluster.server.primary_nodes
    }
    assert backend.get_result(result.id).return_value == "done"
    assert backend.queue_stats()["default"][Segment.SUCCESSFUL] == 2


def test_a_call_after_the_slot_moved_follows_moved_to_the_new_owner(cluster, backend, slot_back_home):
    assert backend.scripts.promote("default", 10) == (0, None)  # connects and caches the slot map
    target = next(node for node in cluster.server.primary_nodes if node is not slot_back_home)
    cluster.server.move_slot(TAGGED, target)

    result = backend.enqueue(echo, ["moved"], {})

    with redis.Redis(port=target.port) as client:
        assert client.zrange("threadmill:{default}:default:ready", 0, -1) == [result.id.encode()]
    assert [r.id for r in backend.acquire("default", worker="w:1")] == [result.id]


def _refused_with_tryagain(node) -> int:
    with redis.Redis(port=node.port) as client:
        return client.info("errorstats").get("errorstat_TRYAGAIN", {}).get("count", 0)


def test_while_the_slot_migrates_a_read_follows_ask_and_a_multi_key_write_waits_for_the_end(
    cluster, backend, slot_back_home
):
    assert backend.scripts.promote("default", 10) == (0, None)
    target = next(node for node in cluster.server.primary_nodes if node is not slot_back_home)
    once = RedisTaskBackend("default", cluster.params(QUEUES=["default"], OPTIONS={"enqueue_retry": 0}))
    seen = {}
    riding = threading.Thread(target=lambda: seen.update(ridden=backend.enqueue(echo, ["in the window"], {})))

    def in_the_migration_window():
        # The source lacks the key, so it answers ASK; the importing target serves a one-key script.
        seen["scan"] = backend.scripts.scan("default", Segment.READY, (b"", b""), 10, False)
        # The target refuses a script over several keys it does not all hold yet (TRYAGAIN).
        with pytest.raises(ServerUnreachable) as caught:
            once.enqueue(echo, ["too early"], {})
        seen["enqueue"] = str(caught.value)
        # With enqueue_retry a call refused so goes again until the slot has moved.
        refused = _refused_with_tryagain(target)
        riding.start()
        deadline = time.monotonic() + 5
        while _refused_with_tryagain(target) == refused:
            assert time.monotonic() < deadline, "the enqueue made in the window was never refused"
            time.sleep(0.01)

    cluster.server.move_slot(TAGGED, target, during=in_the_migration_window)
    result = backend.enqueue(echo, ["after"], {})
    riding.join(10)

    assert seen.pop("enqueue") == "Cannot reach the Redis server: Multiple keys request during rehashing of slot"
    assert seen.pop("scan") == []
    with redis.Redis(port=target.port) as client:
        for stored in (result, seen["ridden"]):
            assert client.hget(f"threadmill:{{default}}:task:{stored.id}", "segment") == b"ready"
    assert backend.totals()["default"]["enqueue_retries"] >= 1
    with redis.Redis(port=slot_back_home.port) as client:
        assert client.dbsize() == 0


def test_telemetry_on_a_cluster_is_sharded_pub_sub_on_the_channels_node(cluster, backend):
    owner = cluster.server.node_for(CHANNEL)
    classic = redis.Redis(port=owner.port).pubsub(ignore_subscribe_messages=True)
    classic.subscribe(CHANNEL)
    assert classic.get_message(timeout=1) is None
    subscription = backend.subscribe_telemetry([CHANNEL])
    assert subscription.next_message(timeout=1) is None

    backend.heartbeat("h:1", {"type": "worker", "pid": 1})
    backend.enqueue(echo, ["x"], {})

    received = [subscription.next_message(timeout=2) for _ in range(2)]
    assert [(channel, json.loads(payload)["type"]) for channel, payload in received] == [
        (CHANNEL, "worker"),
        (CHANNEL, "ingress"),
    ]
    # A classic PUBLISH would have reached this subscriber on the same node at once.
    assert classic.get_message(timeout=0.1) is None
    subscription.close()
    classic.close()


@pytest.fixture
def append_only_owner(cluster):
    """Turn on the append-only file of the primary owning the alias's slot, for this test only."""
    with redis.Redis(port=cluster.server.node_for(TAGGED).port, decode_responses=True) as client:
        client.config_set("appendonly", "yes")
        deadline = time.monotonic() + 10
        while client.info("persistence")["aof_rewrite_in_progress"] or not client.info("persistence")["aof_enabled"]:
            assert time.monotonic() < deadline, "the append-only file was not written within 10 s"
            time.sleep(0.02)
        yield
        client.config_set("appendonly", "no")


def test_fsync_enqueue_on_a_cluster_waits_on_the_connection_that_wrote(cluster, append_only_owner):
    backend = RedisTaskBackend("default", cluster.params(OPTIONS={"fsync_enqueue": True}))
    results = [backend.enqueue(echo, [i], {}) for i in range(3)]
    assert [r.id for r in backend.acquire("default", count=3)] == [r.id for r in results]


def test_a_woken_worker_on_a_cluster_stops_waiting_at_once(backend):
    backend.wake_worker("w:1")  # a MULTI/EXEC pipeline: both of its keys are in the alias's slot
    started = time.monotonic()
    assert backend.wait_for_tasks(["default"], "w:1", 5) is True  # BLPOP on the slot's primary
    assert time.monotonic() - started < 1
    backend.enqueue(echo, ["wake"], {})
    assert backend.wait_for_tasks(["default"], "w:1", 5) is True
