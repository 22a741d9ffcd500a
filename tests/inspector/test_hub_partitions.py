"""The console's telemetry hub on a partitioned alias: it hears task events from every partition's channel."""

from __future__ import annotations

import threading

import pytest
from django.tasks import task_backends

from tests.servers import partition
from tests.tasks import echo
from threadmill.backends.partitions import partition_of


@pytest.fixture(params=["valkey", "cluster"])
def partitioned_hub(request, settings, monkeypatch):
    """This process's `default` alias with three partitions (one server, or the session's cluster), and a hub of its own."""
    from threadmill.api import workers

    where = request.getfixturevalue("cluster") if request.param == "cluster" else None
    partition(settings, where)
    hub = workers.TelemetryHub()
    monkeypatch.setattr(workers, "_hub", hub)
    yield hub
    hub.stop()


def test_the_hub_hears_an_enqueue_to_the_last_partition(partitioned_hub):
    backend = task_backends["default"]
    heard = threading.Event()
    partitioned_hub.subscribe(lambda kind: kind == "queues" and heard.set())
    # Until the subscription is live: each enqueue goes to partition 2, whose channel only a hub
    # subscribed to every partition hears.
    for _ in range(200):
        backend._enqueue_turn = 1
        result = echo.enqueue("to partition 2")
        assert partition_of(result.id) == 2
        if heard.wait(0.05):
            break
    assert heard.is_set(), "the hub never heard partition 2's channel"


def test_two_aliases_of_one_url_with_their_own_connection_options_subscribe_on_their_own(
    settings, redis_url, monkeypatch
):
    # Grouped by URL alone, the second alias's channels rode the first's connection, made with the
    # first's options: another ACL user's, say, whose channel rules may not cover them.
    import time

    import redis

    from threadmill.api import workers

    default = settings.TASKS["default"]
    second = {**default, "OPTIONS": {**default["OPTIONS"], "connection": {"client_name": "hub-second-alias"}}}
    settings.TASKS = {"default": default, "second": second}
    hub = workers.TelemetryHub()
    monkeypatch.setattr(workers, "_hub", hub)
    hub.start()
    try:
        admin = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            names = [c["name"] for c in admin.client_list(_type="pubsub")]
            if "hub-second-alias" in names:
                break
            time.sleep(0.02)
        assert "hub-second-alias" in names, names
    finally:
        hub.stop()
