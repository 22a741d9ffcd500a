"""Pausing a queue: acquire skips it in the same script call; enqueues land; resume wakes a worker."""

from __future__ import annotations

from tests.backends.conftest import enqueue
from tests.tasks import echo, send_email
from threadmill.base import Segment


def test_a_paused_queue_keeps_accepting_tasks_and_gives_none_out(backend, raw):
    assert backend.pause("default", by="alice") is True
    enqueue(backend, echo, 1)
    assert backend.acquire("default", count=5) == []
    assert backend.queue_stats()["default"][Segment.READY] == 1


def test_acquire_across_queues_skips_only_the_paused_one(backend):
    enqueue(backend, echo, 1)
    email = enqueue(backend, send_email, "a@example.com")
    backend.pause("default")
    assert [r.id for r in backend.acquire("default", "emails", count=5)] == [email.id]


def test_pausing_twice_keeps_who_paused_first_and_resume_lets_tasks_out(backend, raw):
    backend.pause("default", by="alice")
    assert backend.pause("default", by="bob") is False
    paused = backend.paused_queues()
    assert list(paused) == ["default"] and paused["default"].by == "alice"
    result = enqueue(backend, echo, 1)
    raw.delete("threadmill:{default}:default:wake")  # An idle worker took the enqueue's token and found nothing.

    assert backend.resume("default") is True

    assert raw.llen("threadmill:{default}:default:wake") == 1
    assert [r.id for r in backend.acquire("default")] == [result.id]
    assert backend.resume("default") is False
    assert backend.paused_queues() == {}
