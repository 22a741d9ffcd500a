"""Workflows on a real Valkey Cluster: a graph over three queues drained by a pool, then drained through a failover.

A workflow keeps every key in its partition's hash tag, so one slot and one primary: its
enqueue, each release and the sweep are single-slot script calls (the release builds keys
from the acknowledged task's own, undeclared but in the same slot). With one partition every
workflow is in partition 0's slot; with three, workflows take the partitions in turn and so
live on different shards. The failover is the cluster's own: the primary owning a workflow's
slot is SIGKILLed mid-drain and its replica promoted. Every task is `count_step`, its runs
logged in order on the counter server.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import redis
from django.tasks import TaskResultStatus
from redis.crc import key_slot

from tests import tasks
from tests.faults.conftest import Tally, wait_for
from tests.faults.test_failover import (  # noqa: F401 - failover_cluster is a fixture
    ALIAS_KEY,
    PROMOTION_TIMEOUT_S,
    failover_cluster,
    is_primary,
    live_nodes,
    replica_of,
)
from tests.faults.test_workflow_faults import Step, final_finish, read_steps, starts_of
from tests.servers import partition
from threadmill.backends.partitions import partition_of
from threadmill.workflows import Workflow, WorkflowResult

pytestmark = pytest.mark.slow

#: The fan-in's parents, spread over the three queues.
PARENTS = 150
#: The pool's threads and prefetch: a failover may rerun what the pool held (a lease or an acknowledgement lost).
THREADS = PREFETCH = 4
#: The lease of the failover test's pool: a task whose acknowledgement the failover lost runs again when it expires.
LEASE_TTL_S = 5
QUEUES = ("default", "emails", "reports")


def graph(parents: int = PARENTS, name: str = "cluster") -> Workflow:
    """A diamond whose nodes sit on three queues, above a fan-in of `parents` over the three, and one join."""
    wf = Workflow(name=name)
    on = {queue: tasks.count_step.using(queue_name=queue) for queue in QUEUES}
    top = wf.add(on["default"], kwargs={"sleep_ms": 20}, name="top")
    left = wf.add(on["emails"], kwargs={"sleep_ms": 20}, after=[top], name="left")
    right = wf.add(on["reports"], kwargs={"sleep_ms": 20}, after=[top], name="right")
    foot = wf.add(on["default"], kwargs={"sleep_ms": 20}, after=[left, right], name="foot")
    fan = [wf.add(on[QUEUES[i % 3]], kwargs={"sleep_ms": 20}, after=[foot], name=f"p{i}") for i in range(parents)]
    wf.add(on["reports"], after=fan, name="join")
    return wf


def assert_each_child_started_after_its_parents(
    run: WorkflowResult, wf: Workflow, steps: list[Step], once: bool = True
) -> None:
    """Every node with parents started (once, unless `once` is false), each time after each parent's final run finished."""
    for node in (n for n in wf.nodes if n.parents):
        starts = starts_of(steps, node.id)
        assert starts and (len(starts) == 1 or not once), f"{node.name} started {len(starts)} times"
        first = min(s.at for s in starts)
        for parent in node.parents:
            finish = final_finish(steps, run.tasks[parent.name])
            assert first > finish.at, f"{node.name} started at {first}, before {parent.name} finished at {finish.at}"


def replica_holds(replica, key: str) -> bool:
    """Whether the replica `replica` has `key` (READONLY: a replica otherwise answers MOVED)."""
    with redis.Redis(port=replica.port) as client:
        client.execute_command("READONLY")
        return bool(client.exists(key))


def wait_until_final(run: WorkflowResult, pool, timeout: float) -> None:
    def final() -> bool:
        run.refresh()
        return pool.alive() and run.counts["SUCCESSFUL"] + run.counts["FAILED"] == len(run.tasks)

    wait_for(final, lambda: f"the workflow is final ({run.counts})", timeout)


def test_a_workflow_over_three_queues_drains_on_a_cluster_each_task_once_in_one_slot(
    cluster, on_cluster, counter, start_pool
):
    wf = graph()
    run = wf.enqueue()
    tally = Tally(on_cluster, counter)
    tally.ids = [node.id for node in wf.nodes]
    owner = cluster.server.node_for(ALIAS_KEY)
    others = [node for node in cluster.server.primary_nodes if node is not owner]
    for node in cluster.server.primary_nodes:
        redis.Redis(port=node.port).config_resetstat()
    pool = start_pool(cluster, "-w", "2", "-t", "2", THREADMILL_TEST_CLUSTER="1")

    wait_until_final(run, pool, 60)
    tally.assert_each_ran_once()
    assert_each_child_started_after_its_parents(run, wf, read_steps(tally))
    assert run.status == TaskResultStatus.SUCCESSFUL and run.counts["SUCCESSFUL"] == len(wf.nodes)
    assert {queue: stats["waiting"] for queue, stats in on_cluster.queue_stats().items()} == dict.fromkeys(QUEUES, 0)
    # Every script of the workflow ran on the one primary that owns the alias's slot.
    assert all("cmdstat_evalsha" not in redis.Redis(port=node.port).info("commandstats") for node in others)


def test_workflows_in_three_partitions_spread_their_script_calls_over_the_three_primaries(
    cluster, counter, start_pool, settings
):
    backend = partition(settings, cluster)
    graphs = [graph(30, name=f"spread-{i}") for i in range(6)]
    runs = [wf.enqueue() for wf in graphs]
    assert sorted(partition_of(run.id) for run in runs) == [0, 0, 1, 1, 2, 2]
    owners = Counter(cluster.server.node_for(backend.task_keys(run.id).workflow(run.id)).port for run in runs)
    assert sorted(owners.values()) == [2, 2, 2], owners  # two workflows' keys on each primary
    tally = Tally(backend, counter)
    tally.ids = [node.id for wf in graphs for node in wf.nodes]
    for node in cluster.server.primary_nodes:
        redis.Redis(port=node.port).config_resetstat()
    pool = start_pool(cluster, "-w", "2", "-t", "2", THREADMILL_TEST_CLUSTER="1", THREADMILL_TEST_PARTITIONS="3")

    for run in runs:
        wait_until_final(run, pool, 60)
    tally.assert_each_ran_once()
    steps = read_steps(tally)
    for wf, run in zip(graphs, runs, strict=True):
        assert run.status == TaskResultStatus.SUCCESSFUL
        assert_each_child_started_after_its_parents(run, wf, steps)
    calls = [
        redis.Redis(port=node.port).info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        for node in cluster.server.primary_nodes
    ]
    print(f"\nscript calls per primary, 6 workflows in 3 partitions: {calls}")
    assert all(count > 0 for count in calls), calls
    # Each shard carries two workflows' releases, so none carries most of the calls.
    assert max(calls) < 0.6 * sum(calls), calls


@pytest.fixture
def on_failover_cluster(failover_cluster, settings, request):
    """Point this process's `default` backend at the failover cluster, one partition (or `partitions` when parametrised)."""
    options = {"lease_ttl": LEASE_TTL_S, "socket_timeout": 1, "worker_timeout": 2}
    options["partitions"] = getattr(request, "param", 1)
    settings.TASKS = {
        "default": {**settings.TASKS["default"], "REDIS_URL": failover_cluster.url, "CLUSTER": True, "OPTIONS": options}
    }
    from django.tasks import task_backends

    return task_backends["default"]


def test_a_workflow_drained_through_a_failover_runs_the_join_once_after_every_parent(
    failover_cluster,
    on_failover_cluster,
    counter,
    start_pool,
):
    wf = graph()
    run = wf.enqueue()
    tally = Tally(on_failover_cluster, counter)
    tally.ids = [node.id for node in wf.nodes]
    primary = failover_cluster.node_for(ALIAS_KEY)
    replica = replica_of(failover_cluster, primary)
    # The enqueue must be on the replica before the kill: a workflow's enqueue does not WAIT for replicas.
    record = on_failover_cluster.keys.workflow(run.id)
    wait_for(lambda: replica_holds(replica, record), lambda: "the replica holds the workflow", 10)
    pool = start_pool(
        failover_cluster,
        *("-w", "1", "-t", str(THREADS), "--prefetch-count", str(PREFETCH)),
        THREADMILL_TEST_CLUSTER="1",
        THREADMILL_TEST_LEASE_TTL=str(LEASE_TTL_S),
    )
    wait_for(lambda: pool.alive() and len(tally.finished()) >= 40, lambda: f"the fan-in drains ({tally.summary()})", 30)

    finished_before = set(tally.finished())
    primary.process.kill()  # SIGKILL: no goodbye to the replica or the cluster
    primary.process.wait()
    killed = time.monotonic()
    assert len(finished_before) < PARENTS, "the fan-in was drained before the kill: nothing was tested"
    wait_for(
        lambda: is_primary(replica), lambda: f"the replica on port {replica.port} is promoted", PROMOTION_TIMEOUT_S
    )
    slot = key_slot(ALIAS_KEY.encode())
    wait_for(
        lambda: all(failover_cluster._owner_seen_by(n, slot) == replica.port for n in live_nodes(failover_cluster)),
        lambda: "every live node names the promoted replica as the slot's owner",
        PROMOTION_TIMEOUT_S,
    )
    wait_until_final(run, pool, 60)
    drained = time.monotonic() - killed

    steps = read_steps(tally)
    finished = tally.finished()
    twice = {task_id: n for task_id, n in finished.items() if n > 1}
    print(
        f"\nworkflow failover: {len(tally.ids)} enqueued, {len(finished_before)} finished before the kill, "
        f"{len(tally.ran())} ran, {len(tally.never_ran())} lost, {len(twice)} ran twice; final {drained:.1f} s after the kill"
    )
    assert tally.never_ran() == [], tally.summary()
    # A task runs again only when the kill lost a write about it (its lease or acknowledgement): one the pool held.
    assert len(twice) <= THREADS + PREFETCH and set(twice.values()) <= {2}, twice
    assert Counter(r.status for r in run.tasks.values()) == {TaskResultStatus.SUCCESSFUL: len(wf.nodes)}
    assert_each_child_started_after_its_parents(run, wf, steps, once=False)
    assert finished[wf.nodes[-1].id] == 1, "the join ran more than once"
    assert "The server answers again after" in pool.output, pool.output[-4000:]


#: The workflows of the partitioned failover test, one a partition, and each one's fan-in.
WORKFLOWS, WORKFLOW_PARENTS = 3, 60


@pytest.mark.parametrize("on_failover_cluster", [3], indirect=True, ids=["partitions-3"])
def test_workflows_in_three_partitions_live_on_three_shards_and_ride_out_one_shards_failover(
    failover_cluster, on_failover_cluster, counter, start_pool
):
    backend = on_failover_cluster
    graphs = [graph(WORKFLOW_PARENTS, name=f"shard-{i}") for i in range(WORKFLOWS)]
    runs = [wf.enqueue() for wf in graphs]
    records = [backend.task_keys(run.id).workflow(run.id) for run in runs]
    owners = [failover_cluster.node_for(record) for record in records]
    assert sorted(partition_of(run.id) for run in runs) == [0, 1, 2]
    assert len({owner.port for owner in owners}) == WORKFLOWS, "the three workflows share a shard"
    tally = Tally(backend, counter)
    tally.ids = [node.id for wf in graphs for node in wf.nodes]
    # The primary of partition 1's workflow dies: not partition 0's, which also holds the alias-wide keys.
    victim = next(i for i, run in enumerate(runs) if partition_of(run.id) == 1)
    primary, record = owners[victim], records[victim]
    replica = replica_of(failover_cluster, primary)
    wait_for(lambda: replica_holds(replica, record), lambda: "the replica holds the workflow", 10)
    pool = start_pool(
        failover_cluster,
        *("-w", "1", "-t", str(THREADS), "--prefetch-count", str(PREFETCH)),
        THREADMILL_TEST_CLUSTER="1",
        THREADMILL_TEST_LEASE_TTL=str(LEASE_TTL_S),
        THREADMILL_TEST_PARTITIONS="3",
    )
    wait_for(lambda: pool.alive() and len(tally.finished()) >= 60, lambda: f"the fan-ins drain ({tally.summary()})", 30)

    finished_before = set(tally.finished())
    primary.process.kill()  # SIGKILL: no goodbye to the replica or the cluster
    primary.process.wait()
    killed = time.monotonic()
    assert not {node.id for node in graphs[victim].nodes} <= finished_before, "its workflow was done: nothing tested"
    wait_for(
        lambda: is_primary(replica), lambda: f"the replica on port {replica.port} is promoted", PROMOTION_TIMEOUT_S
    )
    slot = key_slot(record.encode())
    wait_for(
        lambda: all(failover_cluster._owner_seen_by(n, slot) == replica.port for n in live_nodes(failover_cluster)),
        lambda: "every live node names the promoted replica as the slot's owner",
        PROMOTION_TIMEOUT_S,
    )
    for run in runs:
        wait_until_final(run, pool, 60)
    drained = time.monotonic() - killed

    steps = read_steps(tally)
    finished = tally.finished()
    twice = {task_id: n for task_id, n in finished.items() if n > 1}
    print(
        f"\nworkflows in 3 partitions: {len(tally.ids)} enqueued, {len(finished_before)} finished before the kill, "
        f"{len(tally.ran())} ran, {len(tally.never_ran())} lost, {len(twice)} ran twice; final {drained:.1f} s after the kill"
    )
    assert tally.never_ran() == [], tally.summary()
    assert len(twice) <= THREADS + PREFETCH and set(twice.values()) <= {2}, twice
    for wf, run in zip(graphs, runs, strict=True):
        assert Counter(r.status for r in run.tasks.values()) == {TaskResultStatus.SUCCESSFUL: len(wf.nodes)}
        assert_each_child_started_after_its_parents(run, wf, steps, once=False)
        assert finished[wf.nodes[-1].id] == 1, f"the join of {run.name} ran more than once"
