"""End to end in real Chromium: a running task's progress reaches its page and the running list over the websocket.

While the socket is open the pages' polls are skipped, so every update seen here came over
it; with the socket refused, the task page falls back to its poll.
"""

from __future__ import annotations

import re

import pytest

from tests.inspector.test_browser import browser, expect_text, live, log_in, page  # noqa: F401 - fixtures
from tests.worker.conftest import wait_until

pytestmark = pytest.mark.browser


def _htmx_requests(page) -> list[str]:
    """Collect the URL of every htmx request (a poll's) the page makes from now on."""
    made: list[str] = []
    page.on("request", lambda request: request.headers.get("hx-request") and made.append(request.url))
    return made


def _socket_open(page, polls: list[str]) -> None:
    """Wait until the page's socket is open; a poll before then was the fallback doing its job."""
    page.wait_for_selector("html[data-socket=open]", state="attached")
    polls.clear()


def test_progress_moves_over_the_websocket_with_no_poll(page, live, backend):
    from tests.tasks import report_in_steps

    task_id = report_in_steps.enqueue(["test:live0", "test:live1", "test:live2"]).id
    worker = live.start_worker()
    wait_until(lambda: backend.get_result(task_id).progress, "the task reports its first step")
    polls = _htmx_requests(page)
    log_in(page, f"/threadmill/default/task/{task_id}/")
    _socket_open(page, polls)
    cell = f"#progress-{task_id}"
    expect_text(page, cell, "step 0 <b>of</b> 3")

    backend.client.set("test:live0", 1)
    expect_text(page, cell, "step 1 <b>of</b> 3")
    assert page.locator(f"{cell} progress").get_attribute("value") == "1"
    assert page.locator("#task-timeline tr.running").count() == 1

    page.goto("/threadmill/default/default/running/")
    _socket_open(page, polls)
    backend.client.set("test:live1", 1)
    expect_text(page, cell, "step 2 <b>of</b> 3")

    page.goto(f"/threadmill/default/task/{task_id}/")
    _socket_open(page, polls)
    backend.client.set("test:live2", 1)
    expect_text(page, "#task-state", "SUCCESSFUL")  # pushed when the task's queue acknowledged it
    expect_text(page, "#task-timeline", "successful")
    assert polls == [], "a poll ran while the socket was open"
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0


def test_the_task_page_polls_while_the_socket_is_down(page, live, backend):
    from tests.tasks import report_in_steps

    page.route_web_socket(re.compile(r".*/threadmill/ws/.*"), lambda socket: socket.close())
    task_id = report_in_steps.enqueue(["test:down0"]).id
    worker = live.start_worker()
    wait_until(lambda: backend.get_result(task_id).progress, "the task reports its first step")
    polls = _htmx_requests(page)
    log_in(page, f"/threadmill/default/task/{task_id}/")

    backend.client.set("test:down0", 1)
    expect_text(page, "#task-state", "SUCCESSFUL")
    expect_text(page, "#task-timeline", "successful")
    assert polls, "the page never polled with its socket down"
    assert page.get_attribute("html", "data-socket") != "open"
    assert live.stop_worker(worker) == 0
