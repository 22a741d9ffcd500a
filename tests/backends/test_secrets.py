"""No error or log record of the backend shows the password of REDIS_URL: a failed enqueue on an unreachable server."""

from __future__ import annotations

import logging

import pytest

from tests import tasks
from threadmill.backends.redis import RedisTaskBackend
from threadmill.embedded import free_port
from threadmill.exceptions import ServerUnreachable


@pytest.mark.parametrize("cluster", [False, True], ids=["server", "cluster"])
def test_a_failed_enqueue_names_neither_in_its_error_nor_in_its_log_records_the_password(
    password_server, caplog, cluster
):
    url = password_server.url_with(port=free_port())
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "CLUSTER": cluster, "OPTIONS": {"enqueue_retry": 0.3}})
    with caplog.at_level(logging.DEBUG), pytest.raises(ServerUnreachable) as failed:
        backend.enqueue(tasks.echo, ["never"], {})
    # A cluster's client fails at creation, before the enqueue's retries; a server's, at each attempt.
    assert ("Cannot reach the Redis Cluster at" if cluster else "gave up after trying for") in str(failed.value)
    assert password_server.password not in str(failed.value)
    retries = [r for r in caplog.records if r.getMessage().startswith("Enqueue of task")]
    assert cluster or retries, "the retries are logged"
    assert caplog.records and all(password_server.password not in record.getMessage() for record in caplog.records)


def test_the_cluster_client_s_error_names_the_address_without_its_password(password_server):
    url = password_server.url_with(port=free_port())
    backend = RedisTaskBackend("default", {"REDIS_URL": url, "CLUSTER": True})
    with pytest.raises(ServerUnreachable) as failed:
        backend.client  # noqa: B018 - creating the cluster client reads the slot map
    assert str(failed.value).startswith("Cannot reach the Redis Cluster at redis://deploy:***@127.0.0.1:")
    assert password_server.password not in str(failed.value)
