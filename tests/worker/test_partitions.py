"""A real pool on a partitioned alias (`OPTIONS["partitions"] = 3`): every partition drained, on one
server and on the Valkey Cluster, where the partitions' script calls land on every shard."""

from __future__ import annotations

import time

import pytest
import redis
from django.tasks import TaskResultStatus

from tests import tasks
from tests.servers import partition
from tests.worker.conftest import DEADLINE_S, Worker, run_worker, worker_env
from threadmill.backends.partitions import partition_of
from threadmill.base import Segment

pytestmark = pytest.mark.slow


@pytest.fixture
def partitioned(request, settings):
    """The `default` backend with three partitions, on one Valkey server or the session's cluster; and its env."""
    server = request.getfixturevalue("cluster") if request.param == "cluster" else None
    backend = partition(settings, server)
    url, flag = (server.url, "1") if server else (request.getfixturevalue("redis_url"), "0")
    env = worker_env(THREADMILL_TEST_REDIS_URL=url, THREADMILL_TEST_CLUSTER=flag, THREADMILL_TEST_PARTITIONS="3")
    return backend, env, server


@pytest.mark.parametrize("partitioned", ["valkey", "cluster"], indirect=True)
def test_a_pool_drains_every_partition(partitioned):
    backend, env, server = partitioned
    echoes = [tasks.echo.enqueue(i) for i in range(60)]
    sums = tasks.add.enqueue_many([((i, 1), {}) for i in range(12)])
    assert {partition_of(r.id) for r in echoes} == {0, 1, 2}
    if server is not None:
        for node in server.server.primary_nodes:
            redis.Redis(port=node.port).config_resetstat()

    done = run_worker("-w", "2", "-t", "2", "--exit-empty", env=env)

    assert done.returncode == 0, done.stderr
    assert [backend.get_result(r.id).return_value for r in echoes] == list(range(60))
    assert [backend.get_result(r.id).return_value for r in sums] == list(range(1, 13))
    stats = backend.queue_stats()["default"]
    assert (stats[Segment.READY], stats[Segment.RUNNING], stats[Segment.SUCCESSFUL]) == (0, 0, 72)
    if server is not None:
        # Three partitions, each under a tag aimed at a different third of the slots: every shard ran scripts.
        calls = [
            redis.Redis(port=node.port).info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
            for node in server.server.primary_nodes
        ]
        assert all(count > 0 for count in calls), calls


@pytest.mark.parametrize("partitioned", ["valkey", "cluster"], indirect=True)
def test_an_idle_pool_starts_tasks_enqueued_to_any_partition(partitioned):
    backend, env, _ = partitioned
    worker = Worker("-w", "1", "-t", "2", env=env)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not backend.worker_heartbeats():
            assert time.monotonic() < deadline, worker.output
            time.sleep(0.05)
        results = [tasks.echo.enqueue(i) for i in range(6)]
        assert {partition_of(r.id) for r in results} == {0, 1, 2}
        while any(backend.get_result(r.id).status != TaskResultStatus.SUCCESSFUL for r in results):
            assert time.monotonic() < deadline, worker.output
            time.sleep(0.02)
        assert worker.stop() == 0
    finally:
        worker.close()
