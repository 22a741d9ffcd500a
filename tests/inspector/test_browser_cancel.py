"""End to end in real Chromium: cancel two selected ready tasks from the segment page and find them failed."""

from __future__ import annotations

import pytest

from tests.inspector.test_browser import browser, expect_text, live, log_in, page  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser


def test_cancel_two_selected_ready_tasks_and_see_them_failed(page, live, backend):
    from tests.tasks import echo

    first, second, kept = (echo.enqueue(f"<b>{i}</b>").id for i in range(3))
    log_in(page, "/threadmill/default/default/ready/")
    page.check(f"input[name=ids][value='{first}']")
    page.check(f"input[name=ids][value='{second}']")
    page.click("button:text('Cancel selected…')")
    expect_text(page, "#cancel-count", "2 tasks")
    expect_text(page, "#abort-count", "0 running tasks")
    page.click("button[name=confirmed]")
    expect_text(page, ".messages", "Cancelled 2 tasks; abort requested for 0 running tasks; 0 already finished.")
    expect_text(page, "#tasks-table .total", "1 task")
    assert page.locator(f"input[name=ids][value='{kept}']").count() == 1
    page.goto("/threadmill/default/default/failed/")
    expect_text(page, "#tasks-table .total", "2 tasks")
    expect_text(page, "#tasks-table", "TaskCancelled")
    page.goto("/threadmill/audit/")
    expect_text(page, "#audit-table tbody tr:first-child", "Cancel")
    assert page.csp_violations == []
