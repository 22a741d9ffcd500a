"""End to end in real Chromium: the Tasks page after a real pool ran tasks, its sorting, and one path's page."""

from __future__ import annotations

import pytest

from tests.inspector.test_browser import browser, expect_text, live, log_in, page, shot  # noqa: F401 - fixtures
from tests.worker.conftest import wait_until

pytestmark = pytest.mark.browser


def test_the_tasks_page_shows_what_a_pool_ran_and_leads_to_a_path_s_charts_and_tasks(page, live, backend):
    from tests.tasks import echo, explode

    for i in range(12):
        echo.enqueue(i)
    for _ in range(3):
        explode.enqueue("<b>no</b>")
    worker = live.start_worker()
    wait_until(lambda: sum(s.runs for s in backend.task_stats(minutes=60)) == 15, "the pool's attempts are counted")

    log_in(page, "/threadmill/tasks/")
    expect_text(page, 'tr[data-task="tests.tasks.echo"] .runs', "12")
    expect_text(page, 'tr[data-task="tests.tasks.explode"] .failures', "100.0%")
    page.click('a[data-sort="failures"]')
    page.wait_for_url("**sort=failures**")
    assert page.locator("tbody tr").first.get_attribute("data-task") == "tests.tasks.explode"
    shot(page, "task_paths")

    page.click('tr[data-task="tests.tasks.explode"] a')
    expect_text(page, "#path-failed", "3")
    expect_text(page, "table.errors", "builtins.RuntimeError")
    assert page.locator("section.charts svg polyline").count() >= 2
    page.click('.segment-links a[data-segment="failed"]')
    page.wait_for_url("**/default/default/failed/?task=tests.tasks.explode**")
    assert page.locator("#tasks-table tbody tr").count() == 3
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0
