"""Progress and metadata reported by tasks a real worker runs, read back through get_result."""

from __future__ import annotations

import asyncio

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import run_worker, wait_until
from threadmill import TaskProgress, set_metadata, set_progress

pytestmark = pytest.mark.slow


def _commands(backend, *names: str) -> int:
    stats = backend.client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names)


def test_progress_and_metadata_show_while_the_task_runs_and_stay_after_it_finished(backend, start_worker):
    result = tasks.report_then_wait.enqueue("test:go", {"rows": 3, "source": "<i>upload</i>"})
    start_worker("-w", "1", "-t", "2", "-q", "default")

    running = wait_until(lambda: (r := backend.get_result(result.id)).progress and r, "the task reports its progress")
    assert running.status == TaskResultStatus.RUNNING
    assert running.progress == TaskProgress(3, 10, "three down")
    assert running.metadata == {"rows": 3, "source": "<i>upload</i>"}
    assert asyncio.run(backend.aget_result(result.id)).progress == TaskProgress(3, 10, "three down")

    backend.client.set("test:go", 1)
    finished = wait_until(
        lambda: (r := backend.get_result(result.id)).status == TaskResultStatus.SUCCESSFUL and r, "the task finishes"
    )
    assert finished.progress == TaskProgress(10, 10, "all done")
    assert finished.metadata == {"rows": 3, "source": "<i>upload</i>", "finished": True}


def test_ten_thousand_reports_cost_a_few_writes(backend):
    result = tasks.report_often.enqueue(10_000)
    backend.client.config_resetstat()

    assert run_worker("-w", "1", "-t", "1", "-q", "default", "--exit-empty").returncode == 0

    stored = backend.get_result(result.id)
    assert stored.progress == TaskProgress(10_000, 10_000, "step 10000")
    assert stored.metadata == {"step": 10_000}
    # 20,000 calls; the acquire and the acknowledgement write the hash too. A write every
    # half second at most, and one with the acknowledgement.
    assert _commands(backend, "hset") <= 12


def test_bad_reports_raise_clear_errors_and_change_nothing(backend):
    result = tasks.report_badly.enqueue()

    assert run_worker("-w", "1", "-t", "1", "-q", "default", "--exit-empty").returncode == 0

    stored = backend.get_result(result.id)
    raised = stored.return_value
    assert raised == {
        "done": "TypeError: set_progress's done must be a number, not str.",
        "negative": "ValueError: set_progress's done must be a finite number of at least 0, not -1.",
        "over": "ValueError: set_progress's done (11) must not exceed its total (10).",
        "nan": "ValueError: set_progress's done must be a finite number of at least 0, not nan.",
        "note": "TypeError: set_progress's note must be a string, not int.",
        "json": raised["json"],
        "large": "ValueError: The task's metadata would take 70,011 bytes as JSON; the limit is 65,536.",
    }
    assert raised["json"].startswith("TypeError: set_metadata's value for 'when' is not JSON: ")
    assert stored.progress == TaskProgress(1, 2, "good")
    assert stored.metadata == {"kept": "yes"}


def test_a_retry_starts_without_progress_and_merges_into_the_metadata(backend, start_worker):
    result = tasks.report_then_fail_once.enqueue("test:attempts")
    start_worker("-w", "1", "-t", "1", "-q", "default")

    stored = wait_until(
        lambda: (r := backend.get_result(result.id)).status == TaskResultStatus.SUCCESSFUL and r, "the retry succeeds"
    )

    assert len(stored.errors) == 1
    assert stored.progress is None
    assert stored.metadata == {"first": "attempt", "second": "attempt", "shared": 2}


def test_a_report_outside_a_running_task_is_a_runtime_error():
    with pytest.raises(RuntimeError, match=r"^set_progress\(\) was called outside a running task; "):
        set_progress(1, 2)
    with pytest.raises(RuntimeError, match=r"^set_metadata\(\) was called outside a running task; "):
        set_metadata(rows=1)


def test_a_task_that_reports_nothing_reads_as_no_progress_and_empty_metadata(backend):
    result = tasks.echo.enqueue(1)

    assert run_worker("-w", "1", "-t", "1", "-q", "default", "--exit-empty").returncode == 0

    stored = backend.get_result(result.id)
    assert (stored.progress, stored.metadata) == (None, {})
