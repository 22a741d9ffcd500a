"""The console on a Valkey Cluster backend (`CLUSTER = True`): pages, actions and the live workers page."""

from __future__ import annotations

import json
import time

import pytest
import redis

from inspector.models import AuditEntry
from tests.inspector.conftest import TASK_KEY, csrf_post

pytestmark = pytest.mark.django_db

SEGMENTS = ["ready", "deferred", "running", "successful", "failed", "unreadable"]


@pytest.fixture
def backend(on_cluster):
    """The console's `default` backend, on the cluster (the `seeded` fixture seeds through it)."""
    return on_cluster


@pytest.fixture
def raw(cluster) -> redis.Redis:
    """A plain client on the primary holding the alias's keys."""
    return cluster.client_for("threadmill:{default}")


def test_the_overview_segments_and_task_pages_read_the_cluster(operator_client, seeded):
    overview = operator_client.get("/threadmill/").content.decode()
    for segment in SEGMENTS:
        assert f'data-segment="{segment}">1</a>' in overview
        page = operator_client.get(f"/threadmill/default/default/{segment}/")
        assert page.status_code == 200 and seeded[segment] in page.content.decode()
    detail = operator_client.get(f"/threadmill/default/task/{seeded['failed']}/").content.decode()
    assert "boom &lt;b&gt;bold&lt;/b&gt;" in detail


def test_requeue_delete_and_purge_act_on_the_cluster(operator_client, seeded, raw):
    raw.zadd("threadmill:{default}:default:running", {seeded["running"]: 1})  # stuck: its lease is overdue
    requeue = {"scope": "selected", "ids": [seeded["running"]], "confirmed": "yes"}
    assert csrf_post(operator_client, "/threadmill/default/default/running/requeue/", requeue).status_code == 302
    delete = {"scope": "selected", "ids": [seeded["failed"]], "confirmed": "yes"}
    assert csrf_post(operator_client, "/threadmill/default/default/failed/delete/", delete).status_code == 302
    purge = {"confirm": "default"}
    assert csrf_post(operator_client, "/threadmill/default/default/deferred/purge/", purge).status_code == 302

    assert raw.hget(TASK_KEY + seeded["running"], "segment") == b"ready"
    assert not raw.exists(TASK_KEY + seeded["failed"]) and not raw.exists(TASK_KEY + seeded["deferred"])
    assert [(e.action, e.count) for e in AuditEntry.objects.order_by("id")] == [
        ("requeue", 1),
        ("delete", 1),
        ("purge", 1),
    ]


@pytest.fixture(autouse=True)
def hub_on_the_cluster(on_cluster, monkeypatch):
    """A telemetry hub of each test's own as this process's hub (pages start it), on the cluster's channel.

    The process-wide hub must not subscribe to the cluster: it outlives the test, and the
    other console tests expect it on the session's single server.
    """
    from threadmill.api import workers

    hub = workers.TelemetryHub()
    monkeypatch.setattr(workers, "_hub", hub)
    yield hub.start()
    hub.stop()


def test_the_workers_page_hears_heartbeats_on_sharded_pub_sub(operator_client, backend, hub_on_the_cluster):
    snapshot = {"type": "worker", "state": "running", "host": "h1", "pid": 4242, "queues": ["default"],
                "threads": 4, "busy_threads": 3, "buffer_fill": 2, "buffer_size": 16}  # fmt: skip
    deadline = time.monotonic() + 10
    # Heartbeats until the hub's subscription is live and hears one (the heartbeat script SPUBLISHes it).
    while not any(w.pid == 4242 for w in hub_on_the_cluster.workers()):
        assert time.monotonic() < deadline, "the hub never heard the heartbeat"
        backend.heartbeat("h1:4242", snapshot)
        time.sleep(0.05)

    html = operator_client.get("/threadmill/workers/").content.decode()
    assert 'data-pid="4242" data-state="live"' in html and "3 / 4" in html
    backend.publish_telemetry(json.dumps({**snapshot, "state": "stopped"}))
    deadline = time.monotonic() + 10
    while next(w for w in hub_on_the_cluster.workers() if w.pid == 4242).state != "stopped":
        assert time.monotonic() < deadline, "the hub never heard the goodbye"
        time.sleep(0.05)
