"""aenqueue and aget_result on the event loop: the thread path's stored task, a few connections per loop, closed with it."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued

from tests.servers import SERVER_NAMES, ServerUnderTest
from tests.tasks import echo
from threadmill.backends.aio import CONNECTIONS_PER_LOOP
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment


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


def named(server: ServerUnderTest, name: str) -> RedisTaskBackend:
    """A contract backend whose connections carry `name` (CLIENT SETNAME), so a test counts its own."""
    params = server.params(QUEUES=["default"])
    params["REDIS_URL"] += f"?client_name={name}"
    return RedisTaskBackend("default", params)


def connections_named(server: ServerUnderTest, name: str) -> int:
    """How many client connections named `name` the server kind's nodes hold now."""
    count = 0
    for node in server.server.primary_nodes if server.cluster else [server.server]:
        with redis.Redis(port=node.port) as client:
            count += sum(1 for connection in client.client_list() if connection["name"] == name)
    return count


def wait_until_connections_named(server: ServerUnderTest, name: str, expected: int) -> None:
    deadline = time.monotonic() + 5
    while (count := connections_named(server, name)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert count == expected, f"{count} connections named {name}, {expected} expected"


async def test_hundreds_of_concurrent_aenqueues_on_one_loop_are_each_stored_once(backend):
    results = await asyncio.gather(*(backend.aenqueue(echo, [i], {}) for i in range(300)))
    assert len({r.id for r in results}) == 300
    assert backend.queue_stats()["default"][Segment.READY] == 300


@pytest.mark.parametrize("server", [name for name in SERVER_NAMES if not name.startswith("cluster")], indirect=True)
async def test_concurrent_aenqueues_on_one_loop_share_a_few_connections(server):
    name = f"few-connections-{server.name}"
    backend = named(server, name)
    backend.check_layout()  # the thread path's connection, before counting
    before = connections_named(server, name)
    await asyncio.gather(*(backend.aenqueue(echo, [i], {}) for i in range(300)))
    assert connections_named(server, name) - before <= CONNECTIONS_PER_LOOP


def test_event_loops_in_two_threads_enqueue_side_by_side_and_leave_no_connection_once_closed(server):
    name = f"closed-loops-{server.name}"
    backend = named(server, name)
    backend.check_layout()  # the thread path's connection (a partitioned alias stamps its layout), before counting
    before = connections_named(server, name)

    def enqueue_on_new_loops(thread: int) -> list[str]:
        async def fifty(loop: int) -> list[str]:
            results = await asyncio.gather(*(backend.aenqueue(echo, [thread, loop, i], {}) for i in range(50)))
            return [r.id for r in results]

        return asyncio.run(fifty(0)) + asyncio.run(fifty(1))

    with ThreadPoolExecutor(max_workers=2) as pool:
        ids = [task_id for batch in pool.map(enqueue_on_new_loops, range(2)) for task_id in batch]
    wait_until_connections_named(server, name, before)
    assert len(set(ids)) == 200
    assert backend.queue_stats()["default"][Segment.READY] == 200
