"""Bulk enqueue: many tasks of one task in one script call per batch, all or nothing."""

from __future__ import annotations

import pytest
from django.tasks.signals import task_enqueued

from tests.tasks import echo
from threadmill.backends import enqueue as enqueue_module
from threadmill.base import Segment


def _script_calls(raw) -> int:
    return raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


@pytest.fixture
def raw(raw, backend):
    """The plain client, after the enqueue script is loaded, so a call counts once (no NOSCRIPT round)."""
    backend.enqueue(echo, [0], {})
    raw.flushdb()
    return raw


def test_enqueue_many_stores_every_task_in_order_in_one_script_call(backend, raw):
    raw.config_resetstat()

    results = backend.enqueue_many(echo, [([i], {}) for i in range(250)])

    assert _script_calls(raw) == 1
    assert [r.args for r in results] == [[i] for i in range(250)]
    assert [r.id for r in backend.peek("default", segment="ready", count=250)] == [r.id for r in results]
    assert backend.get_result(results[7].id).args == [7]


def test_enqueue_many_takes_one_call_per_batch(backend, raw, monkeypatch):
    monkeypatch.setattr(enqueue_module, "ENQUEUE_BATCH", 100)
    raw.config_resetstat()
    backend.enqueue_many(echo, [([i], {}) for i in range(250)])
    assert _script_calls(raw) == 3
    assert backend.queue_stats()["default"][Segment.READY] == 250


def test_enqueue_many_sends_task_enqueued_for_each_task(backend):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        results = backend.enqueue_many(echo, [([1], {}), ([2], {"x": 3})])
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [r.id for r in results]


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        ([([1], {}), ([object()], {})], "Unsupported type"),
        ([([1], {}), "junk"], "calls[1] must be an (args, kwargs) pair"),
        ([([1], {}), ("ab", {})], "calls[1] must be a (list, dict) pair"),
        ([([1], {}), ([1], [2])], "calls[1] must be a (list, dict) pair"),
    ],
)
def test_bad_arguments_for_one_task_fail_the_whole_call_before_anything_is_written(backend, raw, calls, message):
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        backend.enqueue_many(echo, calls)
    assert raw.dbsize() == 0


def test_the_task_level_helper_enqueues_through_the_tasks_backend(redis_url):
    results = echo.enqueue_many([([1], {}), ([2], {})])
    assert [echo.get_result(r.id).args for r in results] == [[1], [2]]
