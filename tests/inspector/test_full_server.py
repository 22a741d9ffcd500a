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
    page = _text(overview)
    assert "maxmemory-policy noeviction" in page and 'data-level="bad"' in page
    assert "The server is full: it refuses enqueues" in page
    assert b'threadmill_server_full{backend="default"} 1.0' in metrics.content
    assert b'threadmill_server_maxmemory_bytes{backend="default"} 4.194304e+06' in metrics.content
    status = api.status_report("default", time.time())
    assert status["server"]["full"] is True
    ready = next(q["ready"] for q in status["queues"] if q["queue"] == "default")
    assert ready == full_backend.queue_stats()["default"][api.Segment.READY] > 100


def test_the_console_names_a_refused_enqueue_on_a_full_server_as_full_not_unreachable(full_backend):
    from inspector.security import error_status
    from tests import tasks

    with pytest.raises(ServerOutOfMemory) as refused:
        full_backend.enqueue(tasks.echo, ["x" * 800], {})
    assert error_status(refused.value) == (503, "Redis is full")


def test_the_overview_warns_from_80_percent_of_maxmemory_and_not_below(settings, client_as, viewer):
    from django.tasks import task_backends

    server = start_full_server("valkey", "0")  # no limit yet: the test sets one against what is used
    try:
        settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": server.url}}
        admin = task_backends["default"].client
        client = client_as(viewer)
        page = _text(client.get(reverse("inspector:queue_list")))
        assert "(no maxmemory), maxmemory-policy noeviction." in page and 'data-level="ok"' in page
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", int(used / 0.9))
        page = _text(client.get(reverse("inspector:queue_list")))
        assert 'data-level="warn"' in page and "% full: enqueues are refused at maxmemory." in page
        admin.config_set("maxmemory", used * 4)
        page = _text(client.get(reverse("inspector:queue_list")))
        assert 'data-level="ok"' in page and "full" not in page.split('class="servers"')[1].split("</ul>")[0]
        admin.config_set("maxmemory-policy", "allkeys-lru")
        page = _text(client.get(reverse("inspector:queue_list")))
        assert "maxmemory-policy allkeys-lru may evict tasks, results and limits: set noeviction." in page
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def _text(response) -> str:
    """The page with its runs of white space made single spaces, as a reader sees it."""
    return " ".join(response.content.decode().split())
