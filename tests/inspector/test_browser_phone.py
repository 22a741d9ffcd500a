"""Every console page kind in real Chromium at a phone's width and a desktop's: it fits, and axe finds no serious fault.

One browser context, logged in once, serves every case: a case resizes its page, opens one
page kind and checks the document does not scroll sideways, that every navigation link is
inside the viewport, that touch targets are at least 40 px high on the phone, and that
axe-core reports no serious or critical violation in the light and the dark colour scheme.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import expect

from tests.inspector.test_browser import (  # noqa: F401 - fixtures
    WAIT_MS,
    accept_dialogs,
    browser,
    expect_text,
    live,
    log_in,
    shot,
)

pytestmark = pytest.mark.browser

PHONE, DESKTOP = 390, 1400
#: What a finger must be able to hit on the phone (px).
MIN_TARGET_PX = 40
TARGETS = (
    "header.top nav a, header.top input, nav.segments a, nav.lease-filter a, form.filter input, form.filter button, "
    ".actions button, .actions a.button, td.control button, .pagination a, .confirm button, .confirm input[type=text]"
)


@pytest.fixture(scope="module")
def phone(browser, live):
    """One logged-in page for the whole module, with an audit entry or two to show."""
    context = browser.new_context(base_url=live.url, viewport={"width": PHONE, "height": 844})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    log_in(page)
    asked = accept_dialogs(page)
    page.click('tr[data-queue="emails"] td.control button:text("Pause")')
    expect_text(page, ".messages", "Paused emails")
    page.click('tr[data-queue="emails"] td.control button:text("Resume")')
    expect_text(page, ".messages", "Resumed emails.")
    assert len(asked) == 2
    live.start_worker("-q", "reports")  # a row on the workers page; it takes none of the seeded tasks; live stops it
    yield page
    context.close()


def _goto(path: str, status: int = 200) -> Callable:
    def open_page(page, ids):
        assert page.goto(path.format(**ids)).status == status

    return open_page


def _confirm(segment: str, button: str) -> Callable:
    def open_confirmation(page, ids):
        page.goto(f"/threadmill/default/default/{segment}/")
        page.check(f"input[name=ids][value='{ids[segment]}']")
        page.click(f"button:text('{button}')")
        page.locator("#confirm-count").wait_for()

    return open_confirmation


def _schedules(page, ids):
    page.goto("/threadmill/schedules/")
    if page.locator("a.last-task").count() == 0:  # a last run to show (the schedules survive the flush)
        page.click("tr[data-schedule=yearly-echo] button:text('Run now')")
        page.locator("a.last-task").wait_for()


def _task_path(page, ids):
    from django.tasks import task_backends

    from tests.tasks import echo
    from tests.worker.conftest import wait_until

    echo.using(queue_name="reports").enqueue("counted")  # the module's worker serves reports
    backend = task_backends["default"]
    wait_until(lambda: any(s.runs for s in backend.task_stats(minutes=60)), "the worker counts the run")
    assert page.goto("/threadmill/tasks/default/reports/tests.tasks.echo/").ok


def _workers(page, ids):
    page.goto("/threadmill/workers/")
    page.locator("tr.worker[data-state=live]").first.wait_for()


#: The phone screenshots the README shows (the screenshot command writes them).
SHOTS = {("overview", "light"), ("overview", "dark"), ("segment-failed", "light"), ("task-failed", "light"),
         ("workers", "light")}  # fmt: skip
SEGMENTS = ("ready", "deferred", "running", "successful", "failed", "unreadable")
PAGE_KINDS: dict[str, Callable] = {
    "overview": _goto("/threadmill/"),
    "workers": _workers,
    "schedules": _schedules,
    "tasks": _goto("/threadmill/tasks/"),
    "task-path": _task_path,
    "audit": _goto("/threadmill/audit/"),
    **{f"segment-{s}": _goto(f"/threadmill/default/default/{s}/") for s in SEGMENTS},
    **{f"task-{s}": _goto(f"/threadmill/default/task/{{{s}}}/") for s in SEGMENTS},
    "purge-confirm": _goto("/threadmill/default/default/failed/purge/"),
    "requeue-confirm": _confirm("failed", "Requeue selected…"),
    "cancel-confirm": _confirm("ready", "Cancel selected…"),
    "search": _goto("/threadmill/search/?q=no-such-task", status=404),
    "not-found": _goto("/threadmill/default/no-such-queue/ready/", status=404),
}

_OVERFLOW = """() => {
  const width = window.innerWidth;
  const outside = [...document.querySelectorAll("header.top nav a")]
    .filter(a => { const r = a.getBoundingClientRect(); return r.left < 0 || r.right > width || r.width === 0; })
    .map(a => a.textContent);
  return {scroll: document.documentElement.scrollWidth, width, outside};
}"""

_SMALL_TARGETS = """(selector) => [...document.querySelectorAll(selector)]
  .filter(e => e.offsetParent !== null && e.type !== "hidden")
  .filter(e => e.getBoundingClientRect().height < MIN_TARGET_PX)
  .map(e => e.outerHTML.slice(0, 80) + " " + e.getBoundingClientRect().height)""".replace(
    "MIN_TARGET_PX", str(MIN_TARGET_PX)
)


def serious_violations(page) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    return [
        f"{v['id']} ({v['impact']}): {[node['target'] for node in v['nodes']][:3]} {v['nodes'][0]['failureSummary'][:300]}"
        for v in found
        if v["impact"] in ("serious", "critical")
    ]


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
@pytest.mark.parametrize("kind", PAGE_KINDS)
def test_every_page_kind_fits_the_viewport_and_passes_axe_in_both_colour_schemes(phone, seeded, kind, width):
    phone.set_viewport_size({"width": width, "height": 844})
    PAGE_KINDS[kind](phone, seeded)
    phone.wait_for_load_state("load")
    fit = phone.evaluate(_OVERFLOW)
    assert fit["scroll"] <= fit["width"], f"{kind} scrolls sideways by {fit['scroll'] - fit['width']} px"
    assert fit["outside"] == [], f"{kind}: navigation links outside the viewport"
    if width == PHONE:
        assert phone.evaluate(_SMALL_TARGETS, TARGETS) == []
    for scheme in ("light", "dark"):
        phone.emulate_media(color_scheme=scheme)
        if width == PHONE and (kind, scheme) in SHOTS:
            shot(phone, f"phone_{kind}" + ("_dark" if scheme == "dark" else ""))
        found = serious_violations(phone)
        assert found == [], f"{kind} in {scheme}: " + "\n".join(found)
    phone.emulate_media(color_scheme="light")


@pytest.mark.parametrize("segment", ["ready", "running", "failed"])
def test_a_segment_table_scrolls_in_its_own_box_with_id_and_task_in_view_on_a_phone(phone, seeded, segment):
    phone.set_viewport_size({"width": PHONE, "height": 844})
    phone.goto(f"/threadmill/default/default/{segment}/")
    row = phone.locator(f"tr:has(a:text-is('{seeded[segment]}'))")
    for cell in (row.locator("a.mono"), row.locator("td").nth(2)):
        box = cell.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE, cell
    scroller = phone.evaluate("getComputedStyle(document.querySelector('#tasks-table table')).overflowX")
    assert scroller == "auto"


def test_relative_times_stay_fresh_on_a_live_page_without_a_reload(phone, seeded):
    page = phone.context.new_page()
    try:
        page.clock.install()
        page.goto("/threadmill/default/default/ready/")
        enqueued = page.locator(f"tr:has(a:text-is('{seeded['ready']}')) time").first
        assert re.fullmatch(r"now|\d+ s ago", enqueued.inner_text())
        assert enqueued.get_attribute("title").endswith(" UTC")
        page.evaluate("window.stillTheSamePage = true")
        page.clock.fast_forward("03:00")
        expect(enqueued).to_have_text("3 min ago", timeout=WAIT_MS)
        assert page.evaluate("window.stillTheSamePage") is True
        enqueued.focus()  # a keyboard or a tap shows the exact value
        shown = page.evaluate("e => getComputedStyle(e, '::after').content", enqueued.element_handle())
        assert shown.endswith(' UTC"')
    finally:
        page.close()
