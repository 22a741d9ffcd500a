"""The console's overview, its metrics and the status read answer on a full server (maxmemory, noeviction; #29)."""

from __future__ import annotations

import shutil
import time

import pytest
from django.urls import reverse

from tests.servers import start_full_server
from threadmill import api
from threadmill.exceptions import ServerOutOfMemory


@pytest.fixture
def full_backend(settings):
    """Point the `default` alias at a Valkey of its own, filled with tasks until an enqueue was refused."""
    from django.tasks import task_backends

    from tests import tasks

    server = start_full_server("valkey", "4mb")
    alias = settings.TASKS["default"]
    settings.TASKS = {"default": {**alias, "REDIS_URL": server.url}}
    backend = task_backends["default"]
    with pytest.raises(ServerOutOfMemory):
        for _ in range(100_000):
            backend.enqueue(tasks.echo, ["x" * 800], {})
    yield backend
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


def test_the_overview_the_metrics_and_the_status_answer_on_a_full_server(full_backend, client_as, viewer):
    client = client_as(viewer)
    overview = client.get(reverse("inspector:queue_list"))
    assert overview.status_code == 200
    metrics = client.get(reverse("inspector:metrics"))
    assert metrics.status_code == 200
    assert b"threadmill" in metrics.content
    status = api.status_report("default", time.time())
    assert status["server"]["full"] is True
    ready = next(q["ready"] for q in status["queues"] if q["queue"] == "default")
    assert ready == full_backend.queue_stats()["default"][api.Segment.READY] > 100
