"""End to end in real Chromium: log in, page, requeue, purge, limit, watch workers, and hostile payloads stay text.

The console runs in daphne and the workers as `manage.py threadmill worker` processes, all
on the session's Valkey. With THREADMILL_SCREENSHOTS set to a folder (the screenshot command
of docs/how-to/development.md sets docs/images), each test saves a screenshot of the page it
proves there, and its fingerprint (tests/inspector/screenshots.py); a plain run writes no file.
"""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.inspector import screenshots
from tests.inspector.conftest import dead, heartbeat
from tests.inspector.live import start_live_console
from tests.servers import partition

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip
#: Where screenshots go, or None: only the screenshot command (`screenshots.COMMAND`) writes them.
IMAGES = Path(os.environ["THREADMILL_SCREENSHOTS"]) if os.environ.get("THREADMILL_SCREENSHOTS") else None
#: Milliseconds Playwright waits for a page to show what a test expects.
WAIT_MS = 30_000

if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
    pytest.fail(
        f"{CHROMIUM} is missing; install it with `apt-get install -y chromium` (the README's test command does).",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def live(redis_url):
    console = start_live_console(redis_url)
    yield console
    console.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextmanager
def browser_page(browser, base_url: str):
    """A fresh browser context's page on `base_url`, recording every CSP violation it reports."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.csp_violations = []
    page.on(
        "console",
        lambda message: "Content Security Policy" in message.text and page.csp_violations.append(message.text),
    )
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def page(browser, live):
    with browser_page(browser, live.url) as page:
        yield page


@pytest.fixture(scope="module")
def partitioned_live(redis_url):
    """A live console whose `default` alias has three partitions (started only for the tests that ask)."""
    console = start_live_console(redis_url, settings_module="tests.inspector.partitioned_settings")
    yield console
    console.stop()


def log_in(page, path: str = "/threadmill/", username: str = "admin", password: str = "admin-pw") -> None:
    page.goto(path)
    assert "/admin/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(path) + "$|" + re.escape(path) + r"\?"))


def shot(page, name: str) -> None:
    screenshots.made_from(name)  # a picture the drift test cannot follow fails every run, not only the command's
    if IMAGES is not None:
        IMAGES.mkdir(parents=True, exist_ok=True)
        # caret="initial": hiding the caret injects a style element, which the CSP (rightly) reports.
        page.screenshot(path=str(IMAGES / f"{name}.png"), full_page=True, caret="initial")
        screenshots.record(IMAGES, name)


def fail_task(backend, result, message: str) -> None:
    from threadmill.outcome import error_of, mark_failed

    mark_failed(result, error_of(ValueError(message)), datetime.now(UTC))
    assert backend.acknowledge(result)


def test_log_in_and_page_through_a_queue_with_htmx_swapping_only_the_table(page, live, backend):
    from tests.tasks import echo, send_email

    ids = [echo.enqueue(i, note=f"row {i}").id for i in range(120)]
    for address in ("ada@example.com", "grace@example.com"):
        send_email.enqueue(address)
    log_in(page)
    expect_text(page, 'tr[data-queue="default"] a[data-segment="ready"]', "120")
    shot(page, "queue_list")
    page.click('tr[data-queue="default"] a[data-segment="ready"]')
    expect_text(page, "#tasks-table .total", "120 tasks · page 1 of 3")
    page.evaluate("window.stillTheSamePage = true")
    page.click("#tasks-table ul.pagination li.next a")
    expect_text(page, "#tasks-table .total", "page 2 of 3")
    assert "page=2" in page.url
    assert page.evaluate("window.stillTheSamePage") is True  # htmx swapped the table; no navigation
    assert page.locator("header.top").count() == 1 and page.locator("#tasks-table").count() == 1
    assert page.locator(f"a:text-is('{ids[50]}')").count() == 1
    assert page.locator(f"a:text-is('{ids[0]}')").count() == 0
    shot(page, "task_list")
    assert page.csp_violations == []


def test_a_partitioned_queue_pages_by_cursor_next_then_previous(browser, partitioned_live, settings):
    from tests.tasks import echo

    partition(settings)  # enqueue over the same three partitions the live console reads
    ids = [echo.enqueue(i).id for i in range(120)]
    with browser_page(browser, partitioned_live.url) as page:
        log_in(page, "/threadmill/default/default/ready/")
        expect_text(page, "#tasks-table .total", "120 tasks")
        assert page.locator("#tasks-table .total").inner_text() == "120 tasks"  # no "page X of Y"
        page.evaluate("window.stillTheSamePage = true")
        page.click("#tasks-table ul.pagination li.next a")
        page.wait_for_url(re.compile(r"[?&]after="))
        expect_text(page, "#tasks-table tbody tr:first-child", ids[50])
        assert page.locator(f"a:text-is('{ids[0]}')").count() == 0
        page.click("#tasks-table ul.pagination li.previous a")
        page.wait_for_url(re.compile(r"[?&]before="))
        expect_text(page, "#tasks-table tbody tr:first-child", ids[0])
        assert page.locator(f"a:text-is('{ids[49]}')").count() == 1
        assert page.evaluate("window.stillTheSamePage") is True  # htmx swapped the table each time
        assert page.csp_violations == []


def test_requeue_a_stuck_running_task_and_see_it_complete(page, live, backend):
    from tests.tasks import echo

    stuck = echo.enqueue("stuck").id
    (leased,) = backend.acquire("default", worker="ghost:1")  # a worker that died holding it
    assert leased.id == stuck
    dead(backend, "ghost:1")
    worker = live.start_worker()
    log_in(page, "/threadmill/default/default/running/")
    page.check(f"input[name=ids][value='{stuck}']")
    page.click("button:text('Requeue selected…')")
    expect_text(page, "#confirm-count", "1 task")
    shot(page, "action_confirm")
    page.click("button[name=confirmed]")
    expect_text(page, ".messages", "Requeued 1 task.")
    page.goto(f"/threadmill/default/task/{stuck}/")
    expect_text(page, "#task-state", "SUCCESSFUL")  # the detail page polls its status partial
    shot(page, "task_detail")
    confirmations = []
    page.once("dialog", lambda dialog: (confirmations.append(dialog.message), dialog.accept()))
    page.click("button:text('Requeue this task')")
    expect_text(page, ".messages", f"Requeued task {stuck}.")
    assert confirmations == [f"Requeue task {stuck}?"]
    expect_text(page, "#task-state", "SUCCESSFUL")
    expect_text(page, "dl.facts", "Attempts3")  # ghost:1's abandoned attempt, then two runs
    assert live.stop_worker(worker) == 0


def test_a_task_on_a_live_worker_is_skipped_until_the_operator_forces_it(page, live, backend):
    from tests.tasks import echo

    bulk, single = echo.enqueue("bulk").id, echo.enqueue("single").id
    assert {r.id for r in backend.acquire("default", count=2, worker="busy:1")} == {bulk, single}
    heartbeat(backend, "busy:1", age_s=-600)  # stamped ahead, so it stays fresh however slow the test runs
    log_in(page, "/threadmill/default/default/running/")
    page.check(f"input[name=ids][value='{bulk}']")
    page.click("button:text('Requeue selected…')")
    expect_text(page, "#live-count", "1 running task")
    expect_text(page, "#live-warning", "would run it twice at once, so it is skipped")
    page.click("button[name=confirmed]")
    expect_text(
        page, ".messages", "Requeued 0 tasks; 1 running task was skipped: its worker is alive and its lease current."
    )
    expect_text(page, "#tasks-table .total", "2 tasks")
    page.check(f"input[name=ids][value='{bulk}']")
    page.click("button:text('Requeue selected…')")
    page.check("#force")
    page.click("button[name=confirmed]")
    expect_text(page, ".messages", "Requeued 1 task. Forced: a task still running on a live worker may run twice.")
    expect_text(page, "#tasks-table .total", "1 task")

    page.goto(f"/threadmill/default/task/{single}/")
    expect_text(page, "#live-warning", "a requeue skips it")
    confirmations = []
    page.on("dialog", lambda dialog: (confirmations.append(dialog.message), dialog.accept()))
    page.click("button:text('Requeue this task')")
    expect_text(page, ".messages", f"Task {single} was not requeued: it is running, its worker is alive")
    expect_text(page, "#task-state", "RUNNING")
    page.check("#force")
    page.click("button:text('Requeue this task')")
    expect_text(page, ".messages", f"Requeued task {single}. Forced:")
    expect_text(page, "#task-state", "READY")
    assert confirmations == [f"Requeue task {single}? It is running on a live worker: forced, it may run twice."] * 2
    page.goto("/threadmill/audit/")
    assert page.locator("#audit-table tr[data-forced=true]").count() == 2
    assert page.csp_violations == []


def test_purge_asks_for_the_queue_name_typed(page, live, backend):
    from tests.tasks import explode

    for i in range(3):
        explode.enqueue(f"failure <b>{i}</b>")
    for result in backend.acquire("default", count=3, worker="ghost:2"):
        fail_task(backend, result, f"failure {result.args[0]}")
    log_in(page, "/threadmill/default/default/failed/")
    expect_text(page, "#tasks-table .total", "3 tasks")
    page.click("a:text('Purge failed…')")
    expect_text(page, "#confirm-count", "3 tasks")
    page.fill("input[name=confirm]", "defualt")
    page.click("button:text('Purge')")
    expect_text(page, "#form-errors", "Type the queue name, default, exactly to purge it.")
    shot(page, "purge_confirm")
    page.fill("input[name=confirm]", "default")
    page.click("button:text('Purge')")
    expect_text(page, ".messages", "Purged 3 tasks from default failed.")
    expect_text(page, "#tasks-table .total", "0 tasks")
    page.goto("/threadmill/audit/")
    expect_text(page, "#audit-table tbody tr:first-child", "Purge")
    shot(page, "audit_list")


def test_the_workers_table_changes_as_a_worker_starts_and_stops(page, live):
    log_in(page, "/threadmill/workers/")
    known = {row.get_attribute("data-pid") for row in page.locator("tr.worker").all()}
    worker = live.start_worker()
    new_row = page.locator("tr.worker[data-state=live]" + "".join(f":not([data-pid='{pid}'])" for pid in known)).first
    new_row.wait_for()
    pid = new_row.get_attribute("data-pid")
    shot(page, "worker_list")
    assert live.stop_worker(worker) == 0
    page.locator(f"tr.worker[data-pid='{pid}'][data-state=stopped]").wait_for()


def test_script_and_img_onerror_payloads_in_args_execute_nothing(page, live, backend, raw):
    from tests.tasks import echo

    payloads = [
        "<script>window.pwned = 1; alert('script')</script>",
        "<img src=x onerror=\"window.pwned = 2; alert('img')\">",
    ]
    task_id = echo.enqueue(payloads[0], note=payloads[1]).id
    unreadable = echo.enqueue("x").id
    raw.hset(f"threadmill:{{default}}:task:{unreadable}", "data", payloads[1] + payloads[0])
    assert backend.acquire("default", count=2, worker="ghost:3") != []
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    log_in(page, "/threadmill/default/default/running/")
    page.get_by_text("window.pwned = 1", exact=False).first.wait_for()
    for path in ["/threadmill/default/default/running/", f"/threadmill/default/task/{task_id}/",
                 "/threadmill/default/default/unreadable/", f"/threadmill/default/task/{unreadable}/"]:  # fmt: skip
        page.goto(path)
        page.wait_for_load_state("load")
        assert page.evaluate("window.pwned") is None, path
        assert page.locator("main img").count() == 0, path
    expect_text(page, "#raw-payload", "<img src=x onerror=")
    shot(page, "task_detail_unreadable")
    assert dialogs == []
    page.goto("/threadmill/default/no-such-queue/ready/")
    expect_text(page, "#reason", "No queue named 'no-such-queue' on backend 'default'.")
    shot(page, "error")


def test_the_overview_updates_live_while_the_demo_workload_runs(page, live):
    from inspector.demo import enqueue_demo_workload

    log_in(page)
    page.evaluate("window.stillTheSamePage = true")
    enqueue_demo_workload()
    # The long-running report stays on its queue: this worker serves the other two.
    worker = live.start_worker("-q", "default,emails")
    expect_text(page, 'tr[data-queue="default"] a[data-segment="unreadable"]', "1")
    expect_text(page, 'tr[data-queue="emails"] a[data-segment="successful"]', "5")
    expect_text(page, 'tr[data-queue="default"] a[data-segment="successful"]', "40")
    expect_text(page, 'tr[data-queue="default"] td.status', "1 live worker.")
    assert page.evaluate("window.stillTheSamePage") is True  # every change above arrived over the websocket
    shot(page, "queue_list")
    page.goto("/threadmill/default/default/deferred/")
    expect_text(page, "#tasks-table .total", "3 tasks")  # sync_inventory, waiting for its retry
    assert live.stop_worker(worker) == 0


def expect_text(page, selector: str, text: str) -> None:
    from playwright.sync_api import expect

    expect(page.locator(selector).first).to_contain_text(text, timeout=WAIT_MS)


def accept_dialogs(page) -> list[str]:
    """Accept every confirmation the page asks (hx-confirm) and return their texts as they come."""
    asked: list[str] = []
    page.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    return asked


def test_pause_and_resume_a_queue_from_the_overview(page, live, backend):
    from tests.tasks import send_email

    send_email.enqueue("ada@example.com")
    log_in(page)
    asked = accept_dialogs(page)
    page.click('tr[data-queue="emails"] td.control button:text("Pause")')
    expect_text(page, ".messages", "Paused emails: workers take none of its tasks until it is resumed.")
    expect_text(page, 'tr[data-queue="emails"] td.status', "Paused by admin since")
    assert "emails" in backend.paused_queues()
    shot(page, "queue_list_paused")
    page.click('tr[data-queue="emails"] td.control button:text("Resume")')
    expect_text(page, ".messages", "Resumed emails.")
    assert backend.paused_queues() == {}
    assert asked[0].startswith("Pause queue emails?") and asked[1].startswith("Resume queue emails?")
    page.goto("/threadmill/audit/")
    expect_text(page, "#audit-table tbody tr:first-child", "Resume")
    assert page.csp_violations == []


def test_set_a_queues_limits_from_its_row_see_them_there_then_clear_them(page, live, backend):
    from playwright.sync_api import expect

    log_in(page)
    asked = accept_dialogs(page)
    row = 'tr[data-queue="reports"]'
    page.click(f'{row} td.control a:text("Limits…")')
    page.fill("#limit-form input[name=concurrency]", "-1")
    page.click('#limit-form button:text("Set limits")')
    expect_text(page, "#form-errors", "Concurrency: A concurrency limit is a whole number of at least 1, not -1.")
    page.fill("#limit-form input[name=concurrency]", "3")
    page.fill("#limit-form input[name=rate]", "100/m")
    page.click('#limit-form button:text("Set limits")')
    expect_text(page, ".messages", "Limits of reports: 3 at once, 100/m, until cleared.")
    expect_text(page, f"{row} td.status .limits", "Limits: 3 at once, 100/m.")
    assert backend.queue_limits(["reports"])["reports"].set_by == "admin"
    page.click(f'{row} td.control a:text("Limits…")')
    expect_text(page, 'dd[data-part="runtime"]', "3 at once, 100/m (by admin")
    page.click('#clear-limits-form button:text("Clear runtime limits")')
    expect_text(page, ".messages", "Cleared the runtime limits of reports; in force now: no limits.")
    expect(page.locator(f"{row} td.status .limits")).to_have_count(0)
    assert asked == ["Clear the runtime limits of queue reports? The settings' apply again (no limits)."]
    page.goto("/threadmill/audit/")
    expect_text(page, "#audit-table tbody tr:first-child", "cleared; in force: no limits")
    assert page.csp_violations == []


def test_quiet_then_stop_a_worker_process_from_the_workers_page(page, live, backend):
    worker = live.start_worker("-q", "reports")
    log_in(page, "/threadmill/workers/")
    asked = accept_dialogs(page)
    # The pool's worker process is a child of the one started, with a pid of its own: find it by its queue.
    row = page.locator("tr.worker[data-state=live][data-shown=live]").filter(has=page.locator("td:text('reports')"))
    row.first.wait_for()
    name = row.first.get_attribute("data-worker")
    row.first.locator("button:text('Quiet')").click()
    expect_text(page, ".messages", f"Asked worker {name} to finish what it holds")
    quiet = page.locator(f"tr.worker[data-worker='{name}'][data-shown=quiet]")
    quiet.wait_for()  # "quieting" until the supervisor takes the command, then what the worker reports
    shot(page, "worker_list_quiet")
    quiet.locator("button:text('Stop')").click()
    expect_text(page, ".messages", f"Asked worker {name} to stop gracefully")
    page.locator(f"tr.worker[data-worker='{name}'][data-state=stopped]").wait_for()
    assert asked[0].startswith(f"Quiet worker {name}?") and asked[1].startswith(f"Stop worker {name}?")
    assert live.stop_worker(worker) == 0
    assert page.csp_violations == []


def test_requeue_all_orphaned_takes_back_a_dead_workers_task_and_leaves_a_live_one(page, live, backend):
    from tests.tasks import echo

    orphan, busy = echo.enqueue("orphan").id, echo.enqueue("busy").id
    (leased,) = backend.acquire("default", worker="ghost:9")
    assert leased.id == orphan
    dead(backend, "ghost:9")
    (leased,) = backend.acquire("default", worker="busy:9")
    assert leased.id == busy
    heartbeat(backend, "busy:9", age_s=-600)
    log_in(page, "/threadmill/default/default/running/")
    expect_text(page, f"tr:has(a:text-is('{orphan}'))", "worker gone")
    page.click("a[data-lease=gone]")
    expect_text(page, "#tasks-table .total", "1 task")
    assert page.locator(f"a:text-is('{busy}')").count() == 0
    shot(page, "task_list_orphaned")
    asked = accept_dialogs(page)
    page.click("#requeue-orphaned button")
    expect_text(page, ".messages", "Requeued 1 task whose worker is gone or whose lease is overdue.")
    assert "A task whose worker is alive and whose lease is current is never requeued." in asked[0]
    assert backend.in_segment("default", "running", [orphan, busy]) == [busy]
    backend.requeue_many("default", segment="running", task_ids=[busy], force=True)  # leave the queue clean


def test_the_schedules_page_pauses_resumes_and_runs_a_schedule_now(page, live, backend):
    log_in(page, "/threadmill/schedules/")
    asked = accept_dialogs(page)
    row = 'tr[data-schedule="yearly-echo"]'
    expect_text(page, row, "0 3 1 1 *")
    page.click(f"{row} button:text('Run now')")
    expect_text(page, ".messages", "Enqueued a run of yearly-echo now: task")
    page.click(f"{row} button:text('Pause')")
    expect_text(page, f'{row}[data-state="paused"]', "paused by admin since")
    shot(page, "schedule_list")
    page.click(f"{row} a.last-task")
    expect_text(page, "dl.facts", "tests.tasks.echo")
    page.go_back()
    page.click(f"{row} button:text('Resume')")
    expect_text(page, f'{row}[data-state="enabled"]', "enabled")
    assert [text.split("?")[0] for text in asked] == [
        "Run yearly-echo now",
        "Pause schedule yearly-echo",
        "Resume schedule yearly-echo",
    ]
    assert page.csp_violations == []


def test_a_segment_page_says_how_many_new_tasks_arrived_instead_of_going_stale(page, live, backend):
    from tests.tasks import echo

    echo.enqueue("first")
    log_in(page, "/threadmill/default/default/ready/")
    expect_text(page, "#tasks-table .total", "1 task")
    page.evaluate("window.stillTheSamePage = true")
    for i in range(2):
        echo.enqueue(i)
    expect_text(page, "#new-tasks", "2 new tasks in this segment since the page was loaded.")
    assert page.evaluate("window.stillTheSamePage") is True  # the notice came over the websocket
    page.click("#new-tasks a")
    expect_text(page, "#tasks-table .total", "3 tasks")
    assert page.csp_violations == []


def test_the_search_box_jumps_to_a_task_by_id_and_filters_a_segment_by_text(page, live, backend):
    from tests.tasks import echo, send_email

    elsewhere = send_email.enqueue("grace@example.com").id
    for name in ("ada", "alan", "grace"):
        echo.enqueue(f"{name}@example.com")
    log_in(page, "/threadmill/workers/")
    page.fill("#search", elsewhere)
    page.press("#search", "Enter")
    expect_text(page, "dl.facts", "emails")
    assert page.url.endswith(f"/threadmill/default/task/{elsewhere}/")
    page.goto("/threadmill/default/default/ready/")
    page.fill("#search", "ada@")
    page.press("#search", "Enter")
    expect_text(page, "#tasks-table .total", "1 task matching")
    expect_text(page, "#tasks-table", "ada@example.com")
    assert page.locator("#tasks-table :text('grace@example.com')").count() == 0
    shot(page, "task_list_search")
    page.fill("#search", "no-such-task-id")
    page.press("#search", "Enter")
    expect_text(page, "#tasks-table .total", "0 tasks matching")  # on a segment, text filters it
    page.goto("/threadmill/")
    page.fill("#search", "no-such-task-id")
    page.press("#search", "Enter")
    expect_text(page, "#search-result", "No task has the id no-such-task-id on any backend")
    assert page.csp_violations == []


def test_the_overview_charts_each_queues_history_and_follows_a_dark_colour_scheme(page, live, backend):
    from tests.tasks import echo

    for i in range(5):
        echo.enqueue(i)
    log_in(page)
    chart = page.locator('figure.queue-charts[data-queue="default"] div[data-window="1 hour"] svg').first
    chart.wait_for()
    assert "tasks in, out and failed per min, last 1 hour; peak" in chart.get_attribute("aria-label")
    assert page.locator('figure.queue-charts[data-queue="default"] polyline.in').count() == 2  # 1 h and 24 h
    echo.enqueue("one more")
    # Live: the charts ride in the same fragment as the counts.
    expect_text(page, 'tr[data-queue="default"] a[data-segment="ready"]', "6")
    page.emulate_media(color_scheme="dark")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(11, 18, 32)"
    shot(page, "queue_list_dark")
    page.emulate_media(color_scheme="light")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(250, 250, 250)"
    assert page.csp_violations == []


def test_no_page_load_asks_for_a_file_that_is_missing(page, live):
    missing = []
    page.on("response", lambda response: response.status == 404 and missing.append(response.url))
    log_in(page)
    for path in ["/threadmill/workers/", "/threadmill/schedules/", "/threadmill/default/default/ready/"]:
        page.goto(path)
        page.wait_for_load_state("load")
    icon = page.evaluate("document.querySelector('link[rel=icon]').href")
    assert page.request.get(icon).status == 200
    assert page.request.get("/favicon.ico").status == 200  # redirected to the icon, for pages that do not link it
    assert missing == []


def test_a_requeue_from_a_task_page_opened_before_the_task_ran_names_the_segment_shown_now(page, live, backend):
    from tests.tasks import echo

    task_id = echo.enqueue("late").id
    log_in(page, f"/threadmill/default/task/{task_id}/")
    expect_text(page, "#task-state", "READY")
    worker = live.start_worker()
    expect_text(page, "#task-state", "SUCCESSFUL")  # the status partial polled it
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:text('Requeue this task')")
    # The page was rendered while the task was ready: the form must carry what it shows now.
    expect_text(page, ".messages", f"Requeued task {task_id}.")
    assert live.stop_worker(worker) == 0
