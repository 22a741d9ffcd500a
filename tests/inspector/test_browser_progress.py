"""End to end in real Chromium: a running task's progress bar and note follow it on the running page and its page."""

from __future__ import annotations

import pytest

from tests.inspector.test_browser import browser, expect_text, live, log_in, page  # noqa: F401 - fixtures
from tests.worker.conftest import wait_until

pytestmark = pytest.mark.browser


def test_the_progress_of_a_running_task_follows_it_in_the_console(page, live, backend):
    from tests.tasks import report_in_steps

    task_id = report_in_steps.enqueue(["test:step0", "test:step1"]).id
    worker = live.start_worker()
    wait_until(lambda: backend.get_result(task_id).progress, "the task reports its first step")
    log_in(page, "/threadmill/default/default/running/")
    cell = f"#progress-{task_id}"
    expect_text(page, cell, "0%")
    expect_text(page, cell, "step 0 <b>of</b> 2")  # the note as text, its markup escaped
    assert page.locator(f"{cell} progress").get_attribute("value") == "0"

    backend.client.set("test:step0", 1)
    expect_text(page, cell, "step 1 <b>of</b> 2")  # the page polls the progress cells
    expect_text(page, cell, "50%")

    page.goto(f"/threadmill/default/task/{task_id}/")
    expect_text(page, "#task-status", "step 1 <b>of</b> 2")
    expect_text(page, "#task-metadata", '"html": "<script>alert(1)</script>"')
    assert page.locator("#task-metadata script").count() == 0
    backend.client.set("test:step1", 1)
    expect_text(page, "#task-state", "SUCCESSFUL")  # the page polls its status partial
    expect_text(page, f"#task-status {cell}", "all done")
    assert page.csp_violations == []
    assert live.stop_worker(worker) == 0
