"""TLS and mutual TLS to a real redis-server (Debian's) with certificates made for the test.

A producer enqueues over `rediss://`, a worker pool drains over it (its raw per-thread
connections and the asyncio path are TLS connections too), and a server that requires client
certificates refuses a client without one in a clear error, never a traceback or a lost task.
"""

from __future__ import annotations

import asyncio

import pytest

from tests import tasks
from tests.tls import TlsServer
from tests.worker.conftest import run_worker, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import BackendConnectionError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_server():
    server = TlsServer(client_certs=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mutual_tls_server():
    server = TlsServer(client_certs=True)
    yield server
    server.stop()


def drain_over(server: TlsServer) -> None:
    """Enqueue ten tasks (sync) and two (asyncio) over TLS, drain them with a real pool, check every result."""
    backend = RedisTaskBackend("default", {"REDIS_URL": server.url, "QUEUES": ["default"]})
    ids = [backend.enqueue(tasks.echo, [i], {}).id for i in range(10)]
    ids += [asyncio.run(backend.aenqueue(tasks.echo, [i], {})).id for i in range(2)]
    done = run_worker("-w", "1", "-t", "2", "--exit-empty", env=worker_env(THREADMILL_TEST_REDIS_URL=server.url))
    assert done.returncode == 0, done.stderr[-3000:]
    assert {backend.get_result(task_id).status.name for task_id in ids} == {"SUCCESSFUL"}
    assert server.client().dbsize() > 0  # the tasks are on the TLS server, not elsewhere


def test_a_pool_drains_over_tls(tls_server):
    drain_over(tls_server)


def test_a_pool_drains_over_mutual_tls(mutual_tls_server):
    drain_over(mutual_tls_server)


def test_a_client_without_a_certificate_is_refused_in_a_clear_error_and_stores_nothing(mutual_tls_server):
    mutual_tls_server.client().flushdb()
    backend = RedisTaskBackend(
        "default",
        {"REDIS_URL": mutual_tls_server.url_without_client_certificate, "OPTIONS": {"enqueue_retry": 0}},
    )
    with pytest.raises(BackendConnectionError) as refused:
        backend.enqueue(tasks.echo, ["never"], {})
    assert "Cannot reach the Redis server" in str(refused.value)
    assert mutual_tls_server.client().dbsize() == 0
