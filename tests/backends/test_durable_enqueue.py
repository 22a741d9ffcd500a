"""`fsync_enqueue`: enqueue (and a workflow's) returns only once the server has the task in its append-only file."""

from __future__ import annotations

import signal

import pytest
import redis
from django.tasks import task_backends

from tests.tasks import echo
from threadmill.backends.redis import RedisTaskBackend
from threadmill.embedded import EmbeddedValkey, free_port
from threadmill.exceptions import DurableEnqueueError
from threadmill.workflows import Workflow

READY = "threadmill:{default}:default:ready"


def durable_backend(url: str) -> RedisTaskBackend:
    return RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"fsync_enqueue": True}})


@pytest.fixture
def persistent_valkey(tmp_path):
    """A Valkey of its own with an append-only file fsynced every second, as the embedded default."""
    server = EmbeddedValkey(tmp_path / "valkey", free_port(), persist=True, appendfsync="everysec").start()
    yield server
    server.stop()


def test_fsync_enqueue_without_an_append_only_file_names_the_option_and_the_fix(server):
    # The session servers run without an append-only file; Debian's redis-server 7.0 also lacks WAITAOF.
    backend = RedisTaskBackend("default", server.params(OPTIONS={"fsync_enqueue": True}))
    with pytest.raises(DurableEnqueueError) as caught:
        backend.enqueue(echo, [1], {})
    message = str(caught.value)
    assert message.startswith("The backend option fsync_enqueue is on, but the Redis server ")
    assert message.endswith(", or turn fsync_enqueue off.")
    raw = server.client_for(READY)
    version = raw.info("server")
    if "valkey_version" in version or version["redis_version"] >= "7.2":
        assert "has no append-only file (appendonly no)" in message
        assert "CONFIG SET appendonly yes" in message
    else:
        assert "does not know WAITAOF, which needs Redis or Valkey 7.2 or later" in message
    assert raw.zcard(READY) == 0


def test_fsync_enqueue_keeps_every_reported_task_through_a_sigkill_of_the_server(persistent_valkey):
    backend = durable_backend(persistent_valkey.url)
    reported = [backend.enqueue(echo, [i], {}).id for i in range(200)]
    persistent_valkey.process.send_signal(signal.SIGKILL)
    persistent_valkey.process.wait(10)
    persistent_valkey.stop()
    restarted = EmbeddedValkey(persistent_valkey.data_dir, persistent_valkey.port, persist=True).start()
    try:
        client = redis.Redis.from_url(restarted.url)
        assert {task_id.decode() for task_id in client.zrange(READY, 0, -1)} == set(reported)
        assert all(client.exists(f"threadmill:{{default}}:task:{task_id}") for task_id in reported)
    finally:
        restarted.stop()


def test_fsync_enqueue_on_a_server_with_an_append_only_file_returns_the_task(persistent_valkey):
    backend = durable_backend(persistent_valkey.url)
    result = backend.enqueue(echo, ["kept"], {})
    assert backend.get_result(result.id).args == ["kept"]
    assert backend.scripts.transport._local.aof_checked


def test_a_server_that_loses_its_append_only_file_later_is_caught_on_the_next_enqueue(persistent_valkey):
    backend = durable_backend(persistent_valkey.url)
    backend.enqueue(echo, [1], {})
    backend.client.config_set("appendonly", "no")
    with pytest.raises(DurableEnqueueError, match=r"has no append-only file \(appendonly no\)"):
        backend.enqueue(echo, [2], {})


def test_fsync_enqueue_reports_a_task_the_server_did_not_fsync_in_time(persistent_valkey):
    # With appendfsync no the server never fsyncs on its own, so WAITAOF gives up after its wait.
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": persistent_valkey.url, "OPTIONS": {"fsync_enqueue": True, "socket_timeout": 0.4}}
    )
    backend.enqueue(echo, [1], {})
    backend.client.config_set("appendfsync", "no")
    with pytest.raises(
        DurableEnqueueError, match=r"did not confirm it in its append-only file within 0\.2 s"
    ) as caught:
        backend.enqueue(echo, [2], {})
    task_id = str(caught.value).split()[1]
    assert backend.client.zscore(READY, task_id) is not None


def _durable_default(settings, url: str, **options: float) -> RedisTaskBackend:
    settings.TASKS = {
        "default": {**settings.TASKS["default"], "REDIS_URL": url, "OPTIONS": {"fsync_enqueue": True, **options}}
    }
    return task_backends["default"]


def _chain() -> Workflow:
    wf = Workflow()
    wf.add(echo, ("child",), after=[wf.add(echo, ("parent",))])
    return wf


def test_a_workflow_enqueue_with_fsync_enqueue_refuses_a_server_without_an_append_only_file(redis_url, settings):
    _durable_default(settings, redis_url)
    with pytest.raises(DurableEnqueueError, match=r"^The backend option fsync_enqueue is on, but the Redis server "):
        _chain().enqueue()
    assert redis.Redis.from_url(redis_url).keys("threadmill:{default}:workflow*") == []


def test_a_workflow_enqueue_with_fsync_enqueue_names_a_workflow_not_fsynced_in_time(persistent_valkey, settings):
    backend = _durable_default(settings, persistent_valkey.url, socket_timeout=0.4)
    _chain().enqueue()
    backend.client.config_set("appendfsync", "no")
    with pytest.raises(DurableEnqueueError) as caught:
        _chain().enqueue()
    message = str(caught.value)
    assert message.endswith(
        " (2 tasks) was enqueued, but the server did not confirm it in its append-only file within 0.2 s "
        "(fsync_enqueue): it may be lost if the server crashes now."
    )
    workflow_id = message.split()[1]
    assert backend.get_workflow(workflow_id).counts["WAITING"] == 1
