"""Per-minute history and monotonic totals: what the console's charts and the metrics endpoint read."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.backends.conftest import enqueue, finish
from tests.tasks import echo, explode
from threadmill.backends.broker import RedisBroker
from threadmill.outcome import error_of, mark_failed


@pytest.mark.single_partition
def test_history_counts_enqueued_finished_and_failed_tasks_per_minute(backend):
    for i in range(3):
        enqueue(backend, echo, i)
    enqueue(backend, explode)
    leased = backend.acquire("default", count=4)
    for result in leased[:3]:
        finish(backend, result)
    mark_failed(leased[3], error_of(ValueError("no")), datetime.now(UTC))
    backend.acknowledge(leased[3])

    history = backend.history("default", minutes=5)

    assert [len(series) for series in history.values()] == [5, 5, 5, 5]
    # The last two minutes: the minute may turn during the test.
    assert (sum(history["enqueued"][-2:]), sum(history["finished"][-2:]), sum(history["failed"][-2:])) == (4, 4, 1)
    limits = {"cancelled": 0, "abort_requested": 0, "aborted": 0, "timed_out": 0}
    limits |= {"enqueue_retries": 0, "already_stored": 0}
    assert backend.totals()["default"] == {"enqueued": 4, "finished": 4, "failed": 1, **limits}


def test_a_broker_pass_samples_the_oldest_ready_tasks_age(backend, raw):
    result = enqueue(backend, echo, 1)
    ready_score = raw.zscore("threadmill:{default}:default:ready", result.id)
    raw.zadd("threadmill:{default}:default:ready", {result.id: ready_score - 30_000})  # enqueued 30 s earlier

    RedisBroker(backend, ["default"]).run_once()

    latency = backend.history("default", minutes=2, now=time.time())["latency_s"]
    assert 29 <= max(v for v in latency if v is not None) <= 40


def test_history_is_capped_at_24_hours(backend):
    assert len(backend.history("default", minutes=10**6)["enqueued"]) == 24 * 60
