"""`/threadmill/metrics`: Prometheus text read back by prometheus_client's own parser, and who may scrape it."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-token-for-scrapes"


@pytest.fixture
def token(settings):
    settings.THREADMILL_METRICS_TOKEN = TOKEN
    return TOKEN


def samples(body: bytes) -> dict[tuple[str, frozenset], float]:
    """Parse an exposition with prometheus_client's parser: (sample name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def labels(**pairs: str) -> frozenset:
    return frozenset(pairs.items())


def test_the_metrics_parse_and_count_tasks_workers_and_pauses(operator_client, backend, seeded):
    from tests.tasks import add

    add.enqueue(1, 2)
    backend.pause("emails", by="operator")
    backend.heartbeat(
        "box:7", {"worker": "box:7", "host": "box", "pid": 7, "threads": 4, "busy_threads": 3,
                  "cpu_percent": 12.5, "rss_bytes": 52_000_000}, publish=False,
    )  # fmt: skip
    response = operator_client.get("/threadmill/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    found = samples(response.content)
    default = {"backend": "default", "queue": "default"}
    assert found["threadmill_tasks", labels(**default, segment="ready")] == 2
    for segment in ("deferred", "running", "successful", "failed", "unreadable"):
        assert found["threadmill_tasks", labels(**default, segment=segment)] == 1
    assert found["threadmill_oldest_ready_age_seconds", labels(**default)] >= 0
    assert found["threadmill_oldest_ready_age_seconds", labels(backend="default", queue="emails")] == 0
    assert found["threadmill_queue_paused", labels(backend="default", queue="emails")] == 1
    assert found["threadmill_queue_paused", labels(**default)] == 0
    totals = backend.totals()["default"]
    for name in ("enqueued", "finished", "failed"):
        assert found[f"threadmill_tasks_{name}_total", labels(**default)] == totals[name]
    assert totals["enqueued"] == 7 and totals["failed"] >= 1
    assert found["threadmill_workers_alive", labels(backend="default")] == 1
    worker = labels(backend="default", worker="box:7")
    assert found["threadmill_worker_busy_threads", worker] == 3
    assert found["threadmill_worker_threads", worker] == 4
    assert found["threadmill_worker_cpu_percent", worker] == 12.5
    assert found["threadmill_worker_rss_bytes", worker] == 52_000_000


def test_a_bearer_token_equal_to_the_setting_may_scrape(db, token, seeded):
    response = Client().get("/threadmill/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert ("threadmill_workers_alive", labels(backend="default")) in samples(response.content)


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}", TOKEN,
     "Bearer é", "Bearer \x00"],
)  # fmt: skip
def test_anything_but_the_token_or_a_staff_session_is_a_403(db, token, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = Client().get("/threadmill/metrics", headers=headers)
    assert response.status_code == 403
    assert b"threadmill_" not in response.content


def test_without_a_token_set_a_bearer_is_refused(db, settings):
    settings.THREADMILL_METRICS_TOKEN = ""
    assert Client().get("/threadmill/metrics", headers={"Authorization": "Bearer "}).status_code == 403


def test_a_logged_in_user_who_is_not_staff_is_refused(client_as, db):
    from django.contrib.auth.models import User

    client = client_as(User.objects.create_user("someone", password="pw"))
    assert client.get("/threadmill/metrics").status_code == 403


def test_a_viewer_without_the_change_permission_may_scrape(client_as, viewer):
    assert client_as(viewer).get("/threadmill/metrics").status_code == 200


def test_metrics_answer_only_get(operator_client):
    assert operator_client.post("/threadmill/metrics").status_code in (403, 405)


def test_the_metrics_count_enqueue_retries_and_tasks_a_lost_reply_had_stored(operator_client, settings, redis_url):
    from urllib.parse import urlsplit

    from django.tasks import task_backends

    from tests.faults.proxy import Proxy
    from tests.tasks import add

    with Proxy(urlsplit(redis_url).port) as proxy:
        settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": proxy.url}}
        task_backends["default"].enqueue(add, [0, 0], {})  # connects before the fault
        proxy.lose_replies(1)
        add.enqueue(1, 2)
        found = samples(operator_client.get("/threadmill/metrics").content)
    default = labels(backend="default", queue="default")
    assert found["threadmill_enqueue_retries_total", default] == 1
    assert found["threadmill_tasks_already_stored_total", default] == 1
    assert found["threadmill_tasks_enqueued_total", default] == 2
