"""Per-task-path statistics: a real pool's attempts counted by path, read back from the backend and `/threadmill/metrics`."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus
from prometheus_client.parser import text_string_to_metric_families

from tests import tasks
from tests.worker.conftest import wait_until
from threadmill.api.metrics import exposition
from threadmill.backends.taskstats import BOUNDS_S

pytestmark = pytest.mark.slow


def _by_path(backend, **span) -> dict:
    return {stats.path: stats for stats in backend.task_stats(**span) if stats.queue == "default"}


def test_a_pool_s_attempts_are_counted_per_task_path_with_outcomes_errors_durations_and_waits(backend, start_worker):
    for i in range(20):
        tasks.echo.enqueue(i)
    for _ in range(3):
        tasks.explode.enqueue("no")
    flaky_ids = [tasks.flaky.enqueue("again").id for _ in range(2)]
    for _ in range(5):
        tasks.sleep_for.enqueue(0.03)

    pool = start_worker("-w", "1", "-t", "2")
    # Counts reach the server within about a second of the acknowledgements (FLUSH_INTERVAL_S).
    wait_until(
        lambda: (
            all(backend.get_result(i).status == TaskResultStatus.FAILED for i in flaky_ids)
            and sum(s.runs for s in backend.task_stats(minutes=60)) == 20 + 3 + 6 + 5
        ),
        "every attempt ran and was counted",
    )
    assert pool.stop() == 0, pool.output[-3000:]

    stats = _by_path(backend, minutes=60)
    echo, explode, flaky, sleeper = (stats[f"tests.tasks.{n}"] for n in ("echo", "explode", "flaky", "sleep_for"))
    assert (echo.runs, echo.successful, echo.failed, echo.retried) == (20, 20, 0, 0)
    assert (explode.runs, explode.failed, explode.errors) == (3, 3, {"builtins.RuntimeError": 3})
    # Two tasks of three attempts each: two retried attempts and one final failure apiece.
    assert (flaky.runs, flaky.retried, flaky.failed, flaky.errors) == (6, 4, 2, {"builtins.ValueError": 6})
    assert flaky.failure_rate == 1.0 and echo.failure_rate == 0.0
    # 30 ms runs all land in the bucket above 25 ms; the percentile is interpolated inside it.
    assert sleeper.run_buckets[BOUNDS_S.index(0.05)] == 5 and sum(sleeper.run_buckets) == 5
    assert 0.025 <= sleeper.duration_quantile(0.5) <= 0.05 and sleeper.run_seconds >= 5 * 0.03
    # Queue wait is measured on first attempts only.
    assert (echo.waits, flaky.waits, sleeper.waits) == (20, 2, 5)
    assert stats == _by_path(backend, minutes=None) == _by_path(backend, minutes=24 * 60)

    families = {f.name: f for f in text_string_to_metric_families(exposition().decode())}
    runs = {
        (s.labels["task"], s.labels["outcome"]): s.value
        for s in families["threadmill_task_runs"].samples
        if s.labels["queue"] == "default"
    }
    assert runs[("tests.tasks.echo", "successful")] == 20
    assert runs[("tests.tasks.flaky", "retried")] == 4 and runs[("tests.tasks.flaky", "failed")] == 2
    counts = {
        s.labels["task"]: s.value
        for s in families["threadmill_task_duration_seconds"].samples
        if s.name.endswith("_count")
    }
    assert counts["tests.tasks.echo"] == 20 and counts["tests.tasks.sleep_for"] == 5
    inf = [
        s.value
        for s in families["threadmill_task_wait_seconds"].samples
        if s.name.endswith("_bucket") and s.labels["task"] == "tests.tasks.flaky" and s.labels["le"] == "+Inf"
    ]
    assert inf == [2.0]


def test_the_paths_a_queue_counts_are_capped_and_the_rest_count_as_other(backend, monkeypatch):
    from threadmill.backends import taskstats

    monkeypatch.setattr(taskstats, "PATH_CAP", 2)
    counts = {"default": {f"app.task_{i}": {"runs": 1, "successful": 1} for i in range(4)}}
    backend.record_task_stats(counts)
    stats = _by_path(backend, minutes=None)
    assert sorted(stats) == ["(other)", "app.task_0", "app.task_1"]
    assert stats["(other)"].runs == 2 and stats["app.task_0"].runs == 1
