"""Time limits, cancels and aborts counted per queue, read back from `/threadmill/metrics` and `status --json`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.tasks import TaskResultStatus
from prometheus_client.parser import text_string_to_metric_families

from tests import tasks
from tests.worker.conftest import ROOT, wait_until, worker_env
from threadmill.api.metrics import exposition

pytestmark = pytest.mark.slow

TIMEOUT = "threadmill.exceptions.TaskTimeout"
CANCELLED = "threadmill.exceptions.TaskCancelled"


def _metrics() -> dict[str, float]:
    """The default queue's counters on the metrics page, by sample name."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(exposition().decode())
        for sample in family.samples
        if sample.labels == {"backend": "default", "queue": "default"} and sample.name.endswith("_total")
    }


def _status_totals() -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "status", "--json"],
        cwd=ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return next(q for q in json.loads(done.stdout)["queues"] if q["queue"] == "default")["totals"]


def test_timeouts_cancels_and_aborts_are_counted_in_the_metrics_and_in_status(backend, start_worker):
    cancelled = tasks.echo.enqueue(1)  # ready, cancelled before any worker starts
    aborted = tasks.until_aborted.enqueue()
    timed_out = tasks.past_its_limit.enqueue()
    retried = tasks.past_its_limit_first.enqueue()
    assert backend.cancel(cancelled.id) is True

    pool = start_worker("-w", "1", "-t", "3", env=worker_env(THREADMILL_TEST_ABORT_GRACE="0.3"))
    wait_until(lambda: backend.get_result(aborted.id).status == TaskResultStatus.RUNNING, "the task to abort runs")
    assert backend.cancel(aborted.id) is True
    assert backend.cancel(aborted.id) is True  # asked twice, counted once
    ends = {aborted.id: "FAILED", timed_out.id: "FAILED", retried.id: "SUCCESSFUL"}
    wait_until(lambda: all(backend.get_result(i).status == s for i, s in ends.items()), "the three runs end")
    assert pool.stop() == 0, pool.output[-3000:]

    assert [e.exception_class_path for e in backend.get_result(aborted.id).errors] == [CANCELLED]
    assert [e.exception_class_path for e in backend.get_result(timed_out.id).errors] == [TIMEOUT]
    assert backend.get_result(retried.id).return_value == 2
    expected = {"cancelled": 1, "abort_requested": 1, "aborted": 1, "timed_out": 2}
    totals = backend.totals()["default"]
    assert {name: totals[name] for name in expected} == expected
    assert (totals["finished"], totals["failed"]) == (4, 3)
    metrics = _metrics()
    assert {name: metrics[f"threadmill_tasks_{name}_total"] for name in expected} == expected
    assert _status_totals() == totals


def test_the_counters_help_says_what_each_counts():
    text = exposition().decode()
    assert "# HELP threadmill_tasks_timed_out_total Runs that passed their time limit" in text
    assert "# TYPE threadmill_tasks_aborted_total counter" in text
