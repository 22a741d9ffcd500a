"""Console fixtures: staff users with and without the change permission, a logged-in client, seeded queues."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.test import Client

from tests.servers import wait_until_settled

# Nothing here imports tests.tasks at module level: pytest loads this conftest before the
# session's server exists, and declaring a task would build the backend with no URL yet.

TASK_KEY = "threadmill:{default}:task:"


@pytest.fixture
def backend():
    from django.tasks import task_backends

    return task_backends["default"]


@pytest.fixture
def raw(redis_url) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def _staff(username: str, *, change: bool):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password="pw", is_staff=True)
    if change:
        user.user_permissions.add(Permission.objects.get(codename="change_queue", content_type__app_label="inspector"))
    return user


@pytest.fixture
def operator(db):
    """A staff user who may requeue, delete and purge."""
    return _staff("operator", change=True)


@pytest.fixture
def viewer(db):
    """A staff user without inspector.change_queue: read-only."""
    return _staff("viewer", change=False)


@pytest.fixture
def client_as(db):
    def login(user) -> Client:
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)
        return client

    return login


@pytest.fixture
def operator_client(client_as, operator) -> Client:
    return client_as(operator)


def csrf_post(client: Client, url: str, data: dict, **extra):
    """POST the way a browser does: fetch a console page for the CSRF cookie, send it back."""
    client.get("/threadmill/audit/")
    token = client.cookies["csrftoken"].value
    return client.post(url, data, HTTP_X_CSRFTOKEN=token, **extra)


def finish(backend, result, *, fail: bool = False) -> None:
    from threadmill.outcome import error_of, mark_failed, mark_successful

    now = datetime.now(UTC)
    if fail:
        mark_failed(result, error_of(RuntimeError("boom <b>bold</b>")), now)
    else:
        mark_successful(result, now)
    assert backend.acknowledge(result, "done")


def heartbeat(backend, worker: str, *, age_s: float = 0.0) -> None:
    """Record `worker`'s last heartbeat `age_s` seconds ago by the server's clock, as a live worker does."""
    seconds, micros = backend.client.time()
    backend.client.zadd(backend.keys.workers(), {worker: seconds + micros / 1e6 - age_s})


def dead(backend, worker: str) -> None:
    """Record a heartbeat for `worker` older than the backend's `worker_timeout`: the worker is known dead."""
    wait_until_settled(backend)
    heartbeat(backend, worker, age_s=backend.config.worker_timeout + 60)


@pytest.fixture
def seeded(backend, raw):
    """One task in every segment of the default queue (ready, deferred, running, successful, failed, unreadable)."""
    return seed(backend, raw)


def seed(backend, raw) -> dict[str, str]:
    """Put one task in every segment of the default queue; return their ids by segment."""
    from tests.tasks import add, echo

    running, succeeded, failed, unreadable = (add.enqueue(i, i) for i in range(4))
    leased = {r.id: r for r in backend.acquire("default", count=3, worker="ghost:1")}
    finish(backend, leased[succeeded.id])
    finish(backend, leased[failed.id], fail=True)
    raw.hset(TASK_KEY + unreadable.id, "data", b"<script>alert(1)</script>\xff")
    assert backend.acquire("default") == []
    ready = echo.enqueue("ready")
    deferred = echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)).enqueue("later")
    return {
        "ready": ready.id, "deferred": deferred.id, "running": running.id, "successful": succeeded.id,
        "failed": failed.id, "unreadable": unreadable.id,
    }  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def telemetry_hub_stops_with_the_session():
    """Stop this process's telemetry hub before the session's server goes away."""
    yield
    from threadmill import api

    api.hub().stop()
