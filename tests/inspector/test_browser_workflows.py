"""End to end in real Chromium: the Workflows list and its filter, a 50-task graph a real pool runs, a 10,000-task graph.

The console runs in daphne and the pool as `manage.py threadmill worker`, on the session's
Valkey. While a workflow page's websocket is open its fallback poll is skipped, so a page that
reaches its final state with no htmx request made was followed over the socket. The 10,000-task page's time is measured in the browser (its navigation entry, from the
request to the load event) and bounded: the page draws one page of `GRAPH_PAGE` tasks.
"""

from __future__ import annotations

import re

import pytest

from tests.inspector.test_browser import (  # noqa: F401 - fixtures
    accept_dialogs,
    browser,
    expect_text,
    live,
    log_in,
    page,
    shot,
)
from tests.inspector.test_browser_live_progress import _htmx_requests, _socket_open
from threadmill.api.workflows import GRAPH_PAGE

pytestmark = pytest.mark.browser

#: Longest the 10,000-task workflow's page may take to load, ms (measured 150-400 ms on a shared 2-core VM).
BIG_PAGE_MS = 3_000


def fifty_tasks(name: str = "nightly import"):
    """Enqueue 50 tasks in four layers: extract, 8 fetches, 40 parses (one raises) and a load after every parse."""
    from tests.tasks import echo, explode
    from threadmill.workflows import Workflow

    wf = Workflow(name=name)
    extract = wf.add(echo, ("extract",), name="extract")
    fetches = [wf.add(echo, (f"fetch {i}",), after=[extract], name=f"fetch-{i}") for i in range(8)]
    parses = [
        wf.add(explode if i == 13 else echo, (f"parse {i}",), after=[fetches[i % 8]], name=f"parse-{i}")
        for i in range(40)
    ]
    wf.add(echo, ("load",), after=parses, name="load")
    return wf.enqueue()


def test_the_list_shows_workflows_and_filters_them_by_state(page, live, backend):
    from tests.inspector.conftest import finish
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    waiting = fifty_tasks("waiting import")
    single = Workflow(name="one step")
    single.add(echo, ("once",))
    done = single.enqueue()
    for task in backend.acquire("default", count=2, worker="ghost:1"):
        if task.id == done.tasks["echo"].id:
            finish(backend, task)
    log_in(page, "/threadmill/workflows/")
    expect_text(page, "#workflows-table .total", "2 workflows")
    expect_text(page, f'tr[data-workflow="{done.id}"]', "successful")
    expect_text(page, f'tr[data-workflow="{waiting.id}"]', "running")
    assert page.locator("header.top nav a.active").inner_text() == "Workflows"
    shot(page, "workflow_list")
    page.click('#workflow-states a[data-state="successful"]')
    page.wait_for_url("**state=successful**")
    expect_text(page, "#workflows-table .total", "1 workflow successful")
    assert page.locator("tr.workflow").count() == 1
    page.click(f'tr[data-workflow="{done.id}"] a')
    page.wait_for_url(f"**/threadmill/workflows/{done.id}/**")
    expect_text(page, "#workflow-state", "successful")
    assert page.locator("#cancel-workflow").count() == 0  # nothing left to cancel
    page.goto(f"/threadmill/workflows/{waiting.id}/")
    asked = accept_dialogs(page)
    page.click("#cancel-workflow button")
    expect_text(page, ".messages", f"Workflow {waiting.id}: 50 tasks cancelled, or asked to abort if running.")
    assert asked == [
        "Cancel workflow waiting import? Its tasks that have not run will not run; its running tasks are asked to abort."
    ]
    expect_text(page, '#workflow-counts [data-count="failed"]', "49")
    assert page.csp_violations == []


def test_a_fifty_task_workflow_is_drawn_by_layer_and_follows_its_pool_live(page, live, backend):
    run = fifty_tasks()
    log_in(page, f"/threadmill/workflows/{run.id}/")
    assert page.locator("section.layer").count() == 4
    assert [page.locator(f'section.layer[data-depth="{d}"] a.node').count() for d in range(4)] == [1, 8, 40, 1]
    assert page.locator('a.node[data-state="WAITING"]').count() == 49
    worker = live.start_worker()
    # The page follows the workflow by itself (pushed over the websocket) until it is final.
    expect_text(page, "#workflow-state", "failed")
    assert page.locator('a.node[data-state="SUCCESSFUL"]').count() == 48
    failed = page.locator('a.node[data-state="FAILED"]')
    assert [failed.nth(i).get_attribute("data-node") for i in range(failed.count())] == ["parse-13", "load"]
    expect_text(page, '#workflow-counts [data-count="successful"]', "48")
    expect_text(page, '#workflow-counts [data-count="failed"]', "2")
    shot(page, "workflow_detail")
    asked = accept_dialogs(page)
    page.click("#retry-workflow button")
    expect_text(page, ".messages", f"Workflow {run.id}: 2 tasks will run again.")
    assert asked == ["Retry workflow nightly import? Its 2 failed tasks run again, each after its parents."]
    expect_text(page, "#workflow-state", "failed")  # parse-13 raises again, and load fails after it
    expect_text(page, '#workflow-counts [data-count="successful"]', "48")
    page.click('a.node[data-node="fetch-5"]')
    page.wait_for_url(f"**/threadmill/default/task/{run.tasks['fetch-5'].id}/")
    expect_text(page, "#task-workflow-link", "nightly import")
    assert page.locator("#task-parents a.node").all_inner_texts() == ["extract\nsuccessful"]
    children = page.locator("#task-children a.node")
    assert [children.nth(i).get_attribute("data-node") for i in range(children.count())] == [
        "parse-5", "parse-13", "parse-21", "parse-29", "parse-37",
    ]  # fmt: skip
    assert children.nth(1).get_attribute("data-state") == "FAILED"
    page.click("#task-workflow-link")
    page.wait_for_url(f"**/threadmill/workflows/{run.id}/**")
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0


def test_a_ten_thousand_task_workflow_page_draws_one_page_in_bounded_time(page, live, backend):
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name="fan of 10,000")
    root = wf.add(echo, ("root",), name="root")
    middle = [wf.add(echo, (i,), after=[root], name=f"step-{i}") for i in range(9_998)]
    wf.add(echo, ("join",), after=middle, name="join")
    run = wf.enqueue()
    log_in(page, "/threadmill/workflows/")
    timings = []
    for url in (f"/threadmill/workflows/{run.id}/", f"/threadmill/workflows/{run.id}/?page=50"):
        page.goto(url)
        expect_text(page, "#graph-shown", "of 10000")
        timings.append(page.evaluate("performance.getEntriesByType('navigation')[0].duration"))
        assert page.locator("a.node").count() <= GRAPH_PAGE
    assert page.locator("a.node").last.get_attribute("data-node") == "join"
    print(f"10,000-task workflow page load: {[round(t) for t in timings]} ms")
    assert max(timings) < BIG_PAGE_MS, timings
    expect_text(page, "#graph-shown", "page 50 of 50")
    expect_text(page, "#graph-layers", "3 layers: depth 0, 1 task · depth 1, 9998 tasks · depth 2, 1 task")
    page.click("#graph-pages li.previous a")
    page.wait_for_url(re.compile(r".*page=49$"))
    assert page.locator("a.node").count() == GRAPH_PAGE
    assert page.csp_violations == []


def _fan(name: str):
    """Enqueue six tasks: a root, four after it and a join after those four."""
    from tests.tasks import echo
    from threadmill.workflows import Workflow

    wf = Workflow(name=name)
    root = wf.add(echo, ("root",), name="root")
    wf.add(echo, ("join",), after=[wf.add(echo, (i,), after=[root], name=f"step-{i}") for i in range(4)], name="join")
    return wf.enqueue()


def test_a_workflow_page_follows_its_pool_to_successful_over_the_websocket_with_no_poll(page, live, backend):
    run = _fan("live fan")
    polls = _htmx_requests(page)
    log_in(page, f"/threadmill/workflows/{run.id}/")
    _socket_open(page, polls)
    assert page.locator('a.node[data-state="WAITING"]').count() == 5
    worker = live.start_worker()
    expect_text(page, "#workflow-state", "successful")
    assert page.locator('a.node[data-state="SUCCESSFUL"]').count() == 6
    expect_text(page, '#workflow-counts [data-count="successful"]', "6")
    assert polls == [], "a poll ran while the socket was open"
    assert page.get_attribute("html", "data-socket") == "open"
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0


def test_a_workflow_page_polls_while_the_socket_is_down(page, live, backend):
    page.route_web_socket(re.compile(r".*/threadmill/ws/.*"), lambda socket: socket.close())
    run = _fan("polled fan")
    polls = _htmx_requests(page)
    log_in(page, f"/threadmill/workflows/{run.id}/")
    worker = live.start_worker()
    expect_text(page, "#workflow-state", "successful")
    assert page.locator('a.node[data-state="SUCCESSFUL"]').count() == 6
    assert polls, "the page never polled with its socket down"
    assert page.get_attribute("html", "data-socket") != "open"
    assert live.stop_worker(worker) == 0


def test_the_workflows_list_follows_a_running_workflow_over_the_websocket(page, live, backend):
    run = _fan("listed fan")
    polls = _htmx_requests(page)
    log_in(page, "/threadmill/workflows/")
    _socket_open(page, polls)
    row = f'tr[data-workflow="{run.id}"]'
    assert page.get_attribute(row, "data-state") == "running"
    worker = live.start_worker()
    page.wait_for_selector(f'{row}[data-state="successful"]')
    expect_text(page, f"{row} td:nth-child(7)", "6")  # successful
    queued = _fan("second fan")
    page.wait_for_selector(f'tr.workflow[data-workflow="{queued.id}"]')
    assert page.locator("tr.workflow").first.get_attribute("data-workflow") == queued.id  # newest first
    assert polls == []
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0
