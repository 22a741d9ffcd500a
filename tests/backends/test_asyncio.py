"""aenqueue and aget_result on redis.asyncio: the same stored task as the thread path, no thread hop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from tests.tasks import echo
from threadmill.backends.base import Segment


async def test_aenqueue_stores_what_enqueue_stores(backend):
    result = await backend.aenqueue(echo, [1, "two"], {"three": 3})
    stored = backend.get_result(result.id)
    assert (stored.args, stored.kwargs, stored.segment) == ([1, "two"], {"three": 3}, Segment.READY)
    assert (await backend.aget_result(result.id)).args == [1, "two"]


async def test_aenqueue_sends_task_enqueued_from_the_event_loop_thread(backend):
    threads = []

    async def receiver(sender, task_result, **kwargs):
        threads.append(threading.get_ident())

    task_enqueued.connect(receiver)
    try:
        await backend.aenqueue(echo, [1], {})
    finally:
        task_enqueued.disconnect(receiver)
    assert threads == [threading.get_ident()]


async def test_many_concurrent_aenqueues_all_land(backend):
    results = await asyncio.gather(*(backend.aenqueue(echo, [i], {}) for i in range(100)))
    assert backend.queue_stats()["default"][Segment.READY] == 100
    assert sorted(r.args[0] for r in await asyncio.gather(*(backend.aget_result(r.id) for r in results))) == list(
        range(100)
    )


async def test_aget_result_of_an_unknown_id_raises_task_result_does_not_exist(backend):
    with pytest.raises(TaskResultDoesNotExist):
        await backend.aget_result("no-such-task")
