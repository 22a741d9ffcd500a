"""The console's websocket through channels' WebsocketCommunicator, against the real server's pub/sub."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

pytestmark = pytest.mark.django_db(transaction=True)

CHANNEL = "threadmill:{default}:telemetry"


def _application():
    from inspector.site.asgi import application

    return application


async def _session_cookie(user) -> bytes:
    from django.test import Client

    client = Client()
    await sync_to_async(client.force_login)(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _connect(view: str, cookie: bytes = b"") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie))
    communicator = WebsocketCommunicator(_application(), f"/threadmill/ws/?view={view}", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


def _snapshot(pid: int, **extra) -> str:
    return json.dumps({"type": "worker", "state": "running", "host": "h", "pid": pid, "threads": 2,
                       "busy_threads": 1, "started_at": time.time(), **extra})  # fmt: skip


async def _next(communicator, timeout: float) -> str | None:
    """Return the next message within `timeout`, else None (a timed-out receive_from would kill the app)."""
    if await communicator.receive_nothing(timeout=timeout, interval=0.01):
        return None
    return await communicator.receive_from()


async def _publish_until(raw, communicator, payload: str, needle: str, timeout: float = 10) -> str:
    """Publish `payload` until a message containing `needle` arrives (the hub may still be subscribing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await sync_to_async(raw.publish)(CHANNEL, payload)
        message = await _next(communicator, 0.5)
        if message and needle in message:
            return message
    raise AssertionError(f"no update containing {needle!r} within {timeout} s")


async def test_an_anonymous_socket_is_closed_with_4403(db):
    communicator = await _connect("overview")
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_a_non_staff_socket_is_closed_with_4403(db):
    from django.contrib.auth.models import User

    user = await sync_to_async(User.objects.create_user)("plain", password="pw")
    communicator = await _connect("overview", await _session_cookie(user))
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_a_staff_socket_gets_the_overview_fragment_at_once(operator, seeded):
    communicator = await _connect("overview", await _session_cookie(operator))
    message = await communicator.receive_from(timeout=5)
    assert message.lstrip().startswith('<div id="queues-table" hx-swap-oob="true">')
    assert 'data-segment="failed">1</a>' in message
    await communicator.disconnect()


async def test_the_workers_table_updates_when_a_snapshot_arrives_and_when_the_worker_stops(operator, raw):
    communicator = await _connect("workers", await _session_cookie(operator))
    await communicator.receive_from(timeout=5)
    message = await _publish_until(raw, communicator, _snapshot(7001), 'data-pid="7001" data-state="live"')
    assert "1 / 2" in message
    await _publish_until(raw, communicator, _snapshot(7001, state="stopped"), 'data-pid="7001" data-state="stopped"')
    await communicator.disconnect()


async def test_a_burst_of_telemetry_is_coalesced_to_at_most_four_updates_a_second(operator, raw):
    communicator = await _connect("overview", await _session_cookie(operator))
    await communicator.receive_from(timeout=5)
    await _publish_until(raw, communicator, '{"type":"ingress","queue":"default","count":1}', "queues-table")
    started = time.monotonic()
    for _ in range(200):
        await sync_to_async(raw.publish)(CHANNEL, '{"type":"ingress","queue":"default","count":1}')
    received = 0
    while time.monotonic() - started < 1.5 and await _next(communicator, 0.3) is not None:
        received += 1
    elapsed = time.monotonic() - started
    assert 1 <= received <= 4 * elapsed + 1
    await communicator.disconnect()


async def test_a_hidden_tab_gets_no_updates_until_it_is_visible_again(operator, raw):
    communicator = await _connect("workers", await _session_cookie(operator))
    await communicator.receive_from(timeout=5)
    await _publish_until(raw, communicator, _snapshot(7002), 'data-pid="7002"')
    await communicator.send_to(text_data=json.dumps({"visible": False}))
    while not await communicator.receive_nothing(timeout=0.3):
        await communicator.receive_from()
    for pid in range(7003, 7008):
        await sync_to_async(raw.publish)(CHANNEL, _snapshot(pid))
    assert await communicator.receive_nothing(timeout=1.0)
    await communicator.send_to(text_data=json.dumps({"visible": True}))
    message = await communicator.receive_from(timeout=5)
    assert 'data-pid="7007"' in message
    await communicator.disconnect()


async def test_every_socket_of_a_process_shares_one_redis_subscription(operator, raw):
    cookie = await _session_cookie(operator)
    sockets = [await _connect("overview", cookie) for _ in range(3)]
    for communicator in sockets:
        await communicator.receive_from(timeout=5)
    ((_, subscribers),) = await sync_to_async(raw.pubsub_numsub)(CHANNEL)
    assert subscribers == 1
    for communicator in sockets:
        await communicator.disconnect()


@pytest.mark.parametrize(
    ("query_string", "accepted"),
    [
        (b"view=\xff\xfe", False),  # not UTF-8
        (b"view=%00", False),
        (b"view", False),
        (b"view=overview&view=%3Cscript%3E", False),
        (b"view=" + b"x" * 10_000, False),
        (b"=&&=&", True),  # no view named: the overview
        (b"view=workers", True),
    ],
)
async def test_a_junk_query_string_is_refused_with_4400_or_read_as_a_view(operator, query_string, accepted):
    headers = [(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000"), (b"cookie", await _session_cookie(operator))]  # fmt: skip
    communicator = WebsocketCommunicator(_application(), "/threadmill/ws/", headers=headers)
    communicator.scope["query_string"] = query_string  # raw bytes, as a hostile client can send them
    connected, _ = await communicator.connect()
    assert connected
    if accepted:
        assert "-table" in await communicator.receive_from(timeout=5)
        await communicator.disconnect()
    else:
        assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}


async def test_junk_messages_are_ignored_and_the_socket_keeps_working(operator):
    communicator = await _connect("overview", await _session_cookie(operator))
    await communicator.receive_from(timeout=5)
    junk = ["", "null", "[1, 2]", '"visible"', "\x00", "{", "[" * 100_000, '{"visible": {"deep": [1]}}', "1e999999"]
    for text in junk:
        await communicator.send_input({"type": "websocket.receive", "text": text})
    await communicator.send_to(bytes_data=b"\xff\xfe")
    while not await communicator.receive_nothing(timeout=0.3):
        await communicator.receive_from()
    await communicator.send_to(text_data=json.dumps({"visible": True}))
    assert (await communicator.receive_from(timeout=5)).lstrip().startswith('<div id="queues-table"')
    await communicator.disconnect()


async def test_a_segment_page_is_told_how_many_new_tasks_arrived_since_it_was_rendered(operator, raw):
    from tests.tasks import echo

    await sync_to_async(echo.enqueue)("already there")
    query = "segment&backend=default&queue=default&segment=ready&total=1"
    communicator = await _connect(query, await _session_cookie(operator))
    first = await communicator.receive_from(timeout=5)
    assert first.lstrip().startswith('<p id="new-tasks"') and "new task" not in first
    for i in range(3):
        await sync_to_async(echo.enqueue)(i)
    deadline = time.monotonic() + 10
    message = ""
    while "3 new tasks" not in message:
        assert time.monotonic() < deadline, f"no notice of the new tasks: {message!r}"
        message = await _next(communicator, 0.5) or message
    assert 'href="/threadmill/default/default/ready/"' in message and 'hx-swap-oob="true"' in message
    await communicator.disconnect()


@pytest.mark.parametrize(
    "query",
    [
        "segment&backend=nope&queue=default&segment=ready&total=0",
        "segment&backend=default&queue=no-such-queue&segment=ready&total=0",
        "segment&backend=default&queue=default&segment=doing&total=0",
        "segment&backend=default&queue=default&segment=ready&total=-1",
        "segment&backend=default&queue=default&segment=ready&total=%C2%B2",
        "segment&backend=default&queue=default&segment=ready&total=" + "9" * 5000,
        "segment&backend=default&queue=default&segment=ready",
    ],
)
async def test_a_segment_socket_naming_no_known_segment_is_closed_with_4400(operator, query):
    communicator = await _connect(query, await _session_cookie(operator))
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}


def _two_step_workflow(name: str):
    """Enqueue a workflow of two tasks, the second after the first; an HTML-looking name tests the escaping."""
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name=name)
    wf.add(echo, ("after",), after=[wf.add(echo, ("first",), name="first")], name="second")
    return wf.enqueue()


def _finish_one(backend) -> None:
    from tests.inspector.conftest import finish

    (leased,) = backend.acquire("default", count=1, worker="ghost:1")
    finish(backend, leased)


async def _next_containing(communicator, needle: str, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = await _next(communicator, 0.5)
        if message and needle in message:
            return message
    raise AssertionError(f"no update containing {needle!r} within {timeout} s")


async def test_a_non_staff_socket_is_refused_a_workflow_with_4403(db):
    from django.contrib.auth.models import User

    run = await sync_to_async(_two_step_workflow)("secret import")
    user = await sync_to_async(User.objects.create_user)("plain", password="pw")
    communicator = await _connect(f"workflow&backend=default&workflow={run.id}&page=1", await _session_cookie(user))
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}


async def test_a_workflow_page_is_pushed_its_graph_only_when_its_counts_move_until_it_is_final(operator, raw, backend):
    run = await sync_to_async(_two_step_workflow)("<b>nightly</b>")
    communicator = await _connect(f"workflow&backend=default&workflow={run.id}&page=1", await _session_cookie(operator))
    first = await communicator.receive_from(timeout=5)
    assert first.lstrip().startswith('<div id="workflow-graph" hx-swap-oob="true"') and 'data-poll="fallback"' in first
    assert 'data-count="waiting">1<' in first and "&lt;b&gt;nightly&lt;/b&gt;" in first and "<b>nightly" not in first
    for _ in range(5):  # telemetry that moves no count of this workflow pushes nothing
        await sync_to_async(raw.publish)(CHANNEL, '{"type":"ingress","queue":"default","count":1}')
    assert await communicator.receive_nothing(timeout=1.0)
    await sync_to_async(_finish_one)(backend)
    message = await _next_containing(communicator, 'data-count="successful">1<')
    assert 'data-count="waiting">0<' in message and 'id="workflow-state">running<' in message
    await sync_to_async(_finish_one)(backend)
    message = await _next_containing(communicator, 'id="workflow-state">successful<')
    assert 'data-count="successful">2<' in message and "data-poll" not in message
    # Final: a change of its record (here its name) and the telemetry that would carry it push nothing more.
    await sync_to_async(raw.hset)(backend.task_keys(run.id).workflow(run.id), "name", "renamed")
    await sync_to_async(raw.publish)(CHANNEL, '{"type":"egress","queue":"default","count":1}')
    assert await communicator.receive_nothing(timeout=1.0)
    await communicator.disconnect()


@pytest.mark.parametrize(
    "query",
    [
        "workflow&backend=nope&workflow={id}&page=1",
        "workflow&backend=default&workflow=%3Cscript%3E&page=1",
        "workflow&backend=default&workflow={id}&page=0",
        "workflow&backend=default&workflow={id}&page=" + "9" * 5000,
        "workflow&backend=default&workflow={id}",
    ],
)
async def test_a_workflow_socket_naming_no_known_workflow_page_is_closed_with_4400(operator, query):
    communicator = await _connect(query.format(id="0" * 32), await _session_cookie(operator))
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}


async def test_the_workflows_list_is_pushed_when_a_workflow_arrives_or_its_counts_move(operator, raw, backend):
    run = await sync_to_async(_two_step_workflow)("<i>first</i>")
    communicator = await _connect("workflows&backend=default&page=1", await _session_cookie(operator))
    first = await communicator.receive_from(timeout=5)
    assert first.lstrip().startswith('<div id="workflows-table" hx-swap-oob="true"') and "1 workflow<" in first
    assert f'data-workflow="{run.id}" data-state="running"' in first and "&lt;i&gt;first&lt;/i&gt;" in first
    await sync_to_async(raw.publish)(CHANNEL, '{"type":"ingress","queue":"default","count":1}')
    assert await communicator.receive_nothing(timeout=1.0)  # nothing it shows moved
    await sync_to_async(_finish_one)(backend)
    await sync_to_async(_finish_one)(backend)
    await _next_containing(communicator, f'data-workflow="{run.id}" data-state="successful"')
    second = await sync_to_async(_two_step_workflow)("second")
    message = await _next_containing(communicator, f'data-workflow="{second.id}"')
    assert "2 workflows<" in message and message.index(second.id) < message.index(run.id)  # newest first
    await communicator.disconnect()


@pytest.mark.parametrize("query", ["workflows&backend=nope&page=1", "workflows&backend=default&page=x", "workflows"])
async def test_a_workflows_socket_naming_no_known_list_page_is_closed_with_4400(operator, query):
    communicator = await _connect(query, await _session_cookie(operator))
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}
