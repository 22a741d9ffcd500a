"""Progress over the websocket: a report a running task makes reaches its page and the running list at once."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async
from django.utils.html import escape

from tests.inspector.test_consumers import _connect, _next, _session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def _report(backend, leased, note: str) -> None:
    progress = json.dumps({"done": 1, "total": 4, "note": note})
    assert backend.report([(leased.id, leased.lease_token, progress, "", False)]) == [1]


async def _report_until(backend, leased, communicator, note: str, timeout: float = 10) -> str:
    """Report until an update carrying `note` arrives (the hub may still be subscribing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await sync_to_async(_report)(backend, leased, note)
        message = await _next(communicator, 0.5)
        if message and escape(note) in message:
            return message
    raise AssertionError(f"no update carrying {note!r} within {timeout} s")


async def _leased(backend):
    from tests.tasks import echo

    await sync_to_async(echo.enqueue)("x")
    (leased,) = await sync_to_async(backend.acquire)("default", count=1, worker="w-1", token_base="t")
    return leased


async def test_a_task_page_socket_pushes_the_status_when_its_task_reports_progress(operator, backend):
    leased = await _leased(backend)
    communicator = await _connect(f"task&backend=default&task={leased.id}", await _session_cookie(operator))
    first = await communicator.receive_from(timeout=5)
    assert first.lstrip().startswith('<div id="task-status" hx-swap-oob="true"')

    message = await _report_until(backend, leased, communicator, "step <b>one</b>")
    assert "step &lt;b&gt;one&lt;/b&gt;" in message and "<b>one</b>" not in message
    assert 'id="task-timeline"' in message
    await communicator.disconnect()


async def test_a_task_page_socket_ignores_the_progress_of_other_tasks(operator, backend):
    from tests.tasks import echo

    leased = await _leased(backend)
    watched = await sync_to_async(echo.enqueue)("watched")
    communicator = await _connect(f"task&backend=default&task={watched.id}", await _session_cookie(operator))
    await communicator.receive_from(timeout=5)
    # The first report may land before the hub listens; a later one would reach a page watching it.
    for i in range(5):
        await sync_to_async(_report)(backend, leased, f"other {i}")
        assert await _next(communicator, 0.2) is None
    await communicator.disconnect()


async def test_a_running_page_socket_pushes_the_progress_bars_of_its_queue(operator, backend):
    leased = await _leased(backend)
    query = "segment&backend=default&queue=default&segment=running&total=1"
    communicator = await _connect(query, await _session_cookie(operator))
    await communicator.receive_from(timeout=5)

    message = await _report_until(backend, leased, communicator, "rows <i>2</i>")
    assert f'<span id="progress-{leased.id}" class="progress" hx-swap-oob="true">' in message
    assert "rows &lt;i&gt;2&lt;/i&gt;" in message
    await communicator.disconnect()


async def test_a_task_socket_naming_no_backend_or_a_bad_id_is_closed_with_4400(operator, backend):
    cookie = await _session_cookie(operator)
    leased = await _leased(backend)
    served = await _connect(f"task&backend=default&task={leased.id}", cookie)
    assert (await served.receive_from(timeout=5)).lstrip().startswith('<div id="task-status"')
    await served.disconnect()
    for query in ["task&backend=nope&task=abc", "task&backend=default&task=", "task&backend=default&task=a%20b"]:
        communicator = await _connect(query, cookie)
        assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4400}, query
