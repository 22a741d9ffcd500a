"""A cluster primary killed mid-drain: its replica takes over and the drain completes, nothing lost.

The cluster is the test's own (three primaries, one replica each), with a node timeout of
one second, so the replica's automatic promotion comes within seconds. Automatic, not an
operator's `CLUSTER FAILOVER TAKEOVER`: a primary that dies with nobody watching is the case
the issue names, and the cluster's own failure detection is part of what is tested.

Every task is enqueued with `wait_replicas` 1, so the replica holds all of them before the
kill: no enqueue may be lost. What asynchronous replication may lose is the last writes of
the drain itself (a lease, an acknowledgement) that the primary had answered but not yet
sent to its replica; on the promoted replica such a task is ready or leased again and runs
once more. Each task that ran twice must be one the pool could hold at the kill (bounded by
its threads and prefetch); the counts are printed.
"""

from __future__ import annotations

import shutil
import time

import pytest
import redis
from django.tasks import task_backends
from redis.crc import key_slot

from tests.cluster import ValkeyCluster
from tests.faults.conftest import Tally, wait_for, wait_for_drain
from threadmill import api
from threadmill.base import Segment

pytestmark = pytest.mark.slow

#: Tasks of 20 ms in the drain.
TASKS = 300
#: The cluster's node timeout: a primary silent this long is failing, and its replica stands.
NODE_TIMEOUT_MS = 1000
#: Worker threads of the pool, and the tasks it may lease ahead of them (its prefetch).
THREADS = 4
PREFETCH = 4
#: Longest the replica's promotion may take: failure detection, then the election.
PROMOTION_TIMEOUT_S = 15.0
#: Lease of the pool: a task whose acknowledgement the failover lost is running on the new
#: primary until its lease expires and the reaper hands it back.
LEASE_TTL_S = 5
#: Seconds the drain may take after the promotion: the lease above, the work left, reconnecting.
AFTER_PROMOTION_S = 30.0
#: The key whose slot holds every key of the `default` alias.
ALIAS_KEY = "threadmill:{default}:queues"


@pytest.fixture
def failover_cluster():
    """A replicated cluster of this test's own: the test kills one of its primaries."""
    cluster = ValkeyCluster(replicas_per_primary=1, node_timeout_ms=NODE_TIMEOUT_MS).start()
    yield cluster
    cluster.stop()
    for node in cluster.nodes:
        shutil.rmtree(node.data_dir, ignore_errors=True)


@pytest.fixture(params=[1, 3], ids=["partitions-1", "partitions-3"])
def partitions(request) -> int:
    """The alias's `partitions`: with 3, the killed primary holds one partition and the others drain on."""
    return request.param


@pytest.fixture
def on_failover_cluster(failover_cluster, settings, partitions):
    """Point this process's `default` backend (the one the tooling API uses) at the failover cluster."""
    options = {"lease_ttl": LEASE_TTL_S, "socket_timeout": 1, "wait_replicas": 1, "worker_timeout": 2}
    options["partitions"] = partitions
    settings.TASKS = {
        "default": {**settings.TASKS["default"], "REDIS_URL": failover_cluster.url, "CLUSTER": True, "OPTIONS": options}
    }
    return task_backends["default"]


def replica_of(cluster: ValkeyCluster, primary) -> object:
    """The node replicating `primary`, as the primary itself reports it."""
    with redis.Redis(port=primary.port, decode_responses=True) as client:
        port = int(client.info("replication")["slave0"]["port"])
    return next(node for node in cluster.nodes if node.port == port)


def live_nodes(cluster: ValkeyCluster) -> list:
    return [node for node in cluster.nodes if node.process.poll() is None]


def is_primary(node) -> bool:
    with redis.Redis(port=node.port, decode_responses=True, socket_timeout=1) as client:
        return client.info("replication")["role"] == "master"


def ready_count() -> int:
    """Ready tasks of the `default` queue, as the console reads them (the tooling API)."""
    [summary] = [s for s in api.overview() if s.queue_name == "default"]
    return summary.counts[Segment.READY]


def test_a_primary_killed_mid_drain_is_replaced_by_its_replica_and_every_task_runs(
    failover_cluster, on_failover_cluster, counter, start_pool, partitions
):
    tally = Tally(on_failover_cluster, counter)
    tally.enqueue(TASKS, sleep_ms=20)
    assert ready_count() == TASKS  # the tooling API's connections now point at the doomed primary
    pool = start_pool(
        failover_cluster,
        *("-w", "1", "-t", str(THREADS), "--prefetch-count", str(PREFETCH)),
        THREADMILL_TEST_CLUSTER="1",
        THREADMILL_TEST_LEASE_TTL=str(LEASE_TTL_S),
        THREADMILL_TEST_PARTITIONS=str(partitions),
    )
    wait_for(lambda: pool.alive() and tally.successful() >= 50, lambda: f"a drain is under way ({tally.summary()})", 30)

    primary = failover_cluster.node_for(ALIAS_KEY)
    replica = replica_of(failover_cluster, primary)
    slot = key_slot(ALIAS_KEY.encode())
    finished_before = set(tally.finished())
    primary.process.kill()  # SIGKILL: no goodbye to the replica or the cluster
    primary.process.wait()
    killed = time.monotonic()
    assert len(finished_before) < TASKS, "the drain ended before the kill: nothing was tested"

    wait_for(
        lambda: is_primary(replica), lambda: f"the replica on port {replica.port} is promoted", PROMOTION_TIMEOUT_S
    )
    promoted = time.monotonic()
    wait_for(
        lambda: all(
            failover_cluster._owner_seen_by(node, slot) == replica.port for node in live_nodes(failover_cluster)
        ),
        lambda: "every live node names the promoted replica as the slot's owner",
        PROMOTION_TIMEOUT_S,
    )

    wait_for_drain(pool, tally, AFTER_PROMOTION_S, "the drain finishes on the promoted replica")
    drained = time.monotonic()
    twice = tally.ran_twice()
    after_acknowledgement = sorted(set(twice) & finished_before)
    print(
        f"\nfailover (partitions {partitions}): promoted {promoted - killed:.1f} s after the kill, drained {drained - promoted:.1f} s later; "
        f"{len(tally.ids)} enqueued, {len(finished_before)} finished before the kill, {len(tally.ran())} ran, {len(tally.never_ran())} lost, "
        f"{len(twice)} ran twice ({len(after_acknowledgement)} of them acknowledged before the kill)"
    )
    assert tally.never_ran() == [], tally.summary()
    assert tally.segments()[Segment.FAILED] == 0, tally.summary()
    # A task runs again only when the kill lost a write about it: it was leased to the pool then.
    assert len(twice) <= THREADS + PREFETCH, tally.summary()
    assert max(twice.values(), default=1) <= 2, twice
    # The console's API answers in this same process, through the new primary.
    assert ready_count() == 0
    assert sum(s.counts[Segment.SUCCESSFUL] for s in api.overview() if s.alias == "default") == TASKS
    assert pool.respawns() == []
    # The pool lost the server and found it again without a restart, which is what the kill tested.
    assert "The server answers again after" in pool.output, pool.output[-4000:]
