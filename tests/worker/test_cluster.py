"""The worker pool and the operator commands on a Valkey Cluster (`CLUSTER = True`): a drain, heartbeats, telemetry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis
from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import ROOT, run_worker, segment_counts, worker_env
from threadmill.base import Segment

pytestmark = pytest.mark.slow


def test_a_pool_drains_a_cluster_backend_and_reports_on_sharded_telemetry(cluster, on_cluster):
    backend = on_cluster
    subscription = backend.subscribe_telemetry([backend.keys.telemetry()])
    assert subscription.next_message(timeout=1) is None  # the subscription's confirmation
    echoes = [tasks.echo.enqueue(i) for i in range(40)]
    sums = tasks.add.enqueue_many([((i, 1), {}) for i in range(10)])
    failure = tasks.explode.enqueue("kaput")
    owner = cluster.server.node_for(backend.keys.telemetry())
    others = [node for node in cluster.server.primary_nodes if node is not owner]
    for node in cluster.server.primary_nodes:
        redis.Redis(port=node.port).config_resetstat()

    done = run_worker(
        "-w", "2", "-t", "2", "--exit-empty",
        env=worker_env(THREADMILL_TEST_REDIS_URL=cluster.url, THREADMILL_TEST_CLUSTER="1"),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert [backend.get_result(r.id).return_value for r in echoes] == list(range(40))
    assert [backend.get_result(r.id).return_value for r in sums] == list(range(1, 11))
    assert backend.get_result(failure.id).status == TaskResultStatus.FAILED
    counts = segment_counts(backend)
    assert (counts[Segment.READY], counts[Segment.RUNNING], counts[Segment.SUCCESSFUL], counts[Segment.FAILED]) == (
        0, 0, 50, 1,
    )  # fmt: skip
    # Every script call of the pool and its broker went to the one primary owning the alias's slot.
    assert all("cmdstat_evalsha" not in redis.Redis(port=node.port).info("commandstats") for node in others)
    events = []
    while message := subscription.next_message(timeout=0.5):
        events.append(json.loads(message[1]))
    subscription.close()
    stopped = {event["pid"] for event in events if event["type"] == "worker" and event["state"] == "stopped"}
    assert len(stopped) == 2
    assert sum(event["count"] for event in events if event["type"] == "egress") == 51
    assert backend.worker_heartbeats() == {}  # each process said goodbye


def _threadmill(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "threadmill", *args],
        cwd=ROOT,
        env=worker_env(THREADMILL_TEST_REDIS_URL=cluster.url, THREADMILL_TEST_CLUSTER="1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_status_pause_and_resume_work_on_a_cluster(cluster, on_cluster):
    tasks.echo.enqueue(1)
    on_cluster.heartbeat("host:42", {"type": "worker", "state": "running", "queues": ["default"], "threads": 2})

    assert "Paused queue 'default'" in _threadmill(cluster, "pause", "default").stdout
    done = _threadmill(cluster, "status", "--json")
    assert "Resumed queue 'default'" in _threadmill(cluster, "resume", "default").stdout

    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    default = next(q for q in status["queues"] if q["queue"] == "default")
    assert (default["ready"], default["workers"], "(command line)" in default["paused"]["by"]) == (1, 1, True)
    assert [worker["worker"] for worker in status["workers"]] == ["host:42"]
    assert on_cluster.paused_queues() == {}
