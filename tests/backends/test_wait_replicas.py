"""`wait_replicas`: enqueue (and a workflow's) returns only once that many replicas confirmed they have the task."""

from __future__ import annotations

import asyncio

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task_backends

from tests.tasks import echo
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import DurableEnqueueError, ReplicaWaitError
from threadmill.workflows import Workflow

READY = "threadmill:{default}:default:ready"


def _replica_of(cluster, key: str) -> redis.Redis:
    """A client on the replica of the primary that owns `key`'s slot."""
    primary = cluster.server.node_for(key)
    with redis.Redis(port=primary.port, decode_responses=True) as client:
        info = client.info("replication")
    return redis.Redis(port=int(info["slave0"]["port"]))


def test_wait_replicas_on_a_replicated_cluster_returns_once_the_replica_has_the_task(replicated_cluster):
    backend = RedisTaskBackend("default", replicated_cluster.params(OPTIONS={"wait_replicas": 1}))
    results = [backend.enqueue(echo, [i], {}) for i in range(20)]
    results += backend.enqueue_many(echo, [([i], {}) for i in range(20, 40)])
    replica = _replica_of(replicated_cluster, READY)
    replica.execute_command("READONLY")  # A cluster replica redirects reads to its primary otherwise.
    # WAIT returned: the replica applied every write, so it holds every id without polling.
    assert {task_id.decode() for task_id in replica.zrange(READY, 0, -1)} == {r.id for r in results}
    replica.close()


def test_wait_replicas_goes_through_aenqueue_too(replicated_cluster):
    backend = RedisTaskBackend("default", replicated_cluster.params(OPTIONS={"wait_replicas": 1}))
    result = asyncio.run(backend.aenqueue(echo, ["a"], {}))
    assert backend.get_result(result.id).args == ["a"]


def test_wait_replicas_without_replicas_names_the_stored_task_and_the_fix(redis_url):
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": redis_url, "OPTIONS": {"wait_replicas": 1, "socket_timeout": 0.4}}
    )
    with pytest.raises(ReplicaWaitError) as caught:
        backend.enqueue(echo, [1], {})
    assert isinstance(caught.value, DurableEnqueueError)
    [task_id] = [t.decode() for t in redis.Redis.from_url(redis_url).zrange(READY, 0, -1)]
    assert str(caught.value) == (
        f"Task(s) {task_id} are stored, but 0 of the 1 replica(s) wait_replicas asks for confirmed them "
        "within 0.2 s: they may be lost if the primary fails now. Give the primary that many replicas "
        "(INFO replication lists them) or lower wait_replicas."
    )


def test_wait_replicas_without_replicas_names_three_ids_of_a_batch_and_counts_the_rest(redis_url):
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": redis_url, "OPTIONS": {"wait_replicas": 1, "socket_timeout": 0.4}}
    )
    with pytest.raises(ReplicaWaitError) as caught:
        backend.enqueue_many(echo, [([i], {}) for i in range(1500)])
    stored = [t.decode() for t in redis.Redis.from_url(redis_url).zrange(READY, 0, -1)]
    # The wait follows each script call, so the error names the first call's batch of 1,000.
    assert len(stored) == 1000
    assert str(caught.value).startswith("Task(s) ")
    named, rest = str(caught.value).removeprefix("Task(s) ").split(" and ", 1)
    assert set(named.split(", ")) <= set(stored) and len(named.split(", ")) == 3
    assert rest.startswith("997 more are stored, but 0 of the 1 replica(s)")


def test_wait_replicas_zero_does_not_wait(redis_url):
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url, "OPTIONS": {"wait_replicas": 0}})
    assert backend.get_result(backend.enqueue(echo, [1], {}).id).args == [1]


@pytest.mark.parametrize("value", [-1, 1.5, True, "1"])
def test_wait_replicas_must_be_a_whole_number_of_zero_or_more(value):
    with pytest.raises(ImproperlyConfigured) as caught:
        RedisTaskBackend("x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": {"wait_replicas": value}})
    assert str(caught.value) == (
        f"TASKS['x']['OPTIONS']['wait_replicas'] must be a whole number, 0 or more, not {value!r}."
    )


def _point_default(settings, params: dict) -> RedisTaskBackend:
    settings.TASKS = {"default": {**settings.TASKS["default"], "CLUSTER": False, **params}}
    return task_backends["default"]


def _fan_in() -> Workflow:
    wf = Workflow()
    parents = [wf.add(echo, (i,)) for i in range(3)]
    wf.add(echo, ("join",), after=parents, name="join")
    return wf


def test_a_workflow_enqueue_with_wait_replicas_returns_once_the_replica_has_all_of_it(replicated_cluster, settings):
    backend = _point_default(settings, replicated_cluster.params(OPTIONS={"wait_replicas": 1}))
    run = _fan_in().enqueue()
    record = backend.keys.workflow(run.id)
    replica = _replica_of(replicated_cluster, record)
    replica.execute_command("READONLY")
    # WAIT returned: the replica applied the script's writes, so it holds the record and every task without polling.
    assert replica.hget(record, "graph") is not None
    assert all(replica.exists(backend.keys.task(result.id)) for result in run.tasks.values())
    replica.close()


def test_a_workflow_enqueue_with_wait_replicas_without_replicas_names_its_tasks_and_the_fix(redis_url, settings):
    _point_default(settings, {"REDIS_URL": redis_url, "OPTIONS": {"wait_replicas": 1, "socket_timeout": 0.4}})
    wf = _fan_in()
    with pytest.raises(ReplicaWaitError) as caught:
        wf.enqueue()
    ids = ", ".join(node.id for node in wf.nodes[:3]) + f" and {len(wf.nodes) - 3} more"
    assert str(caught.value) == (
        f"Task(s) {ids} are stored, but 0 of the 1 replica(s) wait_replicas asks for confirmed them "
        "within 0.2 s: they may be lost if the primary fails now. Give the primary that many replicas "
        "(INFO replication lists them) or lower wait_replicas."
    )
    # Stored whole, as the message says: the wait comes after the one script call.
    assert redis.Redis.from_url(redis_url).zcard(READY) == 3


def test_a_workflow_aenqueue_waits_for_replicas_too(redis_url, settings):
    _point_default(settings, {"REDIS_URL": redis_url, "OPTIONS": {"wait_replicas": 1, "socket_timeout": 0.4}})
    with pytest.raises(ReplicaWaitError, match=r"^Task\(s\) .* are stored, but 0 of the 1 replica\(s\)"):
        asyncio.run(_fan_in().aenqueue())
