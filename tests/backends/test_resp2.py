"""RESP2 (`?protocol=2` in REDIS_URL): the scripts' replies read the same as over RESP3, redis-py's default.

Managed services and proxies that speak only RESP2 exist; every path that reads a reply (the
thread path's raw connections, the command layer, the asyncio path) is driven over it here.
"""

from __future__ import annotations

import asyncio

import pytest

from tests import tasks
from tests.worker.conftest import run_worker, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment

pytestmark = pytest.mark.slow


def test_a_pool_drains_and_the_tooling_reads_over_resp2(redis_url):
    url = f"{redis_url}?protocol=2"
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "QUEUES": ["default"]})
    backend.client.flushdb()
    assert backend.client.connection_pool.connection_kwargs["protocol"] in (2, "2")
    ids = [backend.enqueue(tasks.echo, [i], {}).id for i in range(10)]
    ids += [asyncio.run(backend.aenqueue(tasks.echo, ["async"], {})).id]
    assert backend.peek("default", segment=Segment.READY, count=20).total == 11
    done = run_worker("-w", "1", "-t", "2", "--exit-empty", env=worker_env(THREADMILL_TEST_REDIS_URL=url))
    assert done.returncode == 0, done.stderr[-3000:]
    results = [backend.get_result(task_id) for task_id in ids]
    assert {r.status.name for r in results} == {"SUCCESSFUL"}
    assert [r.return_value for r in results[:3]] == [0, 1, 2]
    assert backend.peek("default", segment=Segment.SUCCESSFUL, count=20).total == 11
