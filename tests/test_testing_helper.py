"""threadmill.testing: `drain()` runs an alias's tasks in the test's process, against the session's real Valkey."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

from tests import tasks
from threadmill.base import Segment
from threadmill.exceptions import DrainTimeout
from threadmill.testing import drain
from threadmill.testing.pytest import threadmill_alias, threadmill_backend, threadmill_server  # noqa: F401 - fixtures

#: The testing how-to's examples (docs/how-to/testing.md), a small project's tests of their own.
EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "testing"


@pytest.fixture
def backend():
    return task_backends["default"]


def held(backend) -> tuple[int, dict[str, float]]:
    """Return the tasks running on the server and the workers that sent a heartbeat and did not say goodbye."""
    return sum(counts[Segment.RUNNING] for counts in backend.queue_stats().values()), backend.worker_heartbeats()


def test_drain_runs_the_tasks_enqueued_to_every_queue(backend):
    enqueued = [
        tasks.echo.enqueue("default queue"),
        tasks.send_email.enqueue("ada@example.com"),
        tasks.echo.using(queue_name="reports").enqueue("reports queue"),
    ]

    drained = drain()

    assert [r.id for r in drained.results] == [r.id for r in enqueued]
    assert [r.status for r in drained.results] == [TaskResultStatus.SUCCESSFUL] * 3
    assert [r.return_value for r in drained.successful] == ["default queue", "sent to ada@example.com", "reports queue"]
    assert drained.attempts == 3 and drained.failed == ()
    assert all(counts[Segment.READY] == 0 for counts in backend.queue_stats().values())
    assert held(backend) == (0, {})


def test_drain_runs_only_the_queues_it_is_given(backend):
    email = tasks.send_email.enqueue("ada@example.com")
    other = tasks.echo.enqueue("stays")

    drained = drain(queues=["emails"])

    assert [r.id for r in drained.results] == [email.id]
    assert backend.get_result(other.id).segment is Segment.READY


def test_drain_names_the_queues_the_alias_does_not_have():
    with pytest.raises(ValueError) as raised:
        drain(queues=["emails", "emials"])

    assert str(raised.value) == "Unknown queue(s) emials; backend 'default' has default, emails, reports."


def test_a_failing_task_ends_failed_and_drain_returns(backend):
    failing = tasks.explode.enqueue("no luck")
    fine = tasks.echo.enqueue(1)

    drained = drain()

    assert [r.id for r in drained.failed] == [failing.id]
    assert drained.failed[0].errors[-1].exception_class_path == "builtins.RuntimeError"
    assert [r.id for r in drained.successful] == [fine.id]
    assert held(backend) == (0, {})


def test_drain_runs_the_retries_of_a_task_until_its_policy_gives_up(backend):
    flaky = tasks.flaky.enqueue("again")  # two retries, 0.05 s and 0.1 s after its failures

    drained = drain()

    assert [r.id for r in drained.results] == [flaky.id]
    stored = drained.results[0]
    assert stored.status == TaskResultStatus.FAILED and stored.attempts == 3
    assert [e.exception_class_path for e in stored.errors] == ["builtins.ValueError"] * 3
    assert drained.attempts == 3 and held(backend) == (0, {})


def test_a_task_deferred_past_the_timeout_stays_deferred(backend):
    later = tasks.echo.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")

    drained = drain(timeout=5)

    assert drained.results == () and drained.attempts == 0
    assert backend.get_result(later.id).segment is Segment.DEFERRED


def test_drain_times_out_naming_the_hung_task_and_leaves_nothing_running(backend):
    tasks.RELEASE.clear()
    hung = tasks.wait_for_release.enqueue()
    try:
        with pytest.raises(DrainTimeout) as raised:
            drain(timeout=0.5)
        stored = backend.get_result(hung.id)
    finally:
        tasks.RELEASE.set()

    assert str(raised.value) == (
        f"drain() timed out after 0.5 s: task {hung.id} (tests.tasks.wait_for_release) still ran; "
        "the tasks it held went back to ready."
    )
    assert stored.segment is Segment.READY and stored.worker_ids != []
    assert stored.errors[-1].exception_class_path == "threadmill.exceptions.AttemptAbandoned"
    assert stored.errors[-1].traceback.endswith("interrupted this attempt when drain() timed out after 0.5 s.\n")
    assert held(backend) == (0, {})


def test_drain_waits_for_tasks_a_limit_holds_back_until_its_timeout(backend):
    enqueued = [tasks.three_a_minute.enqueue(n) for n in range(4)]

    with pytest.raises(DrainTimeout) as raised:
        drain(timeout=1)

    assert str(raised.value) == (
        "drain() timed out after 1 s: no task was running, the ready ones held back by a limit "
        "(or the server did not answer); the tasks it held went back to ready."
    )
    segments = [backend.get_result(r.id).segment for r in enqueued]
    assert segments == [Segment.SUCCESSFUL] * 3 + [Segment.READY]
    assert held(backend) == (0, {})


def test_drain_names_an_alias_that_is_not_a_threadmill_backend(settings):
    settings.TASKS = {**settings.TASKS, "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}

    with pytest.raises(ImproperlyConfigured) as raised:
        drain("immediate")

    assert str(raised.value) == (
        "drain() runs the tasks of a Threadmill backend; TASKS['immediate'] is ImmediateBackend."
    )


def test_the_fixture_points_the_alias_at_an_embedded_server_of_its_own(
    threadmill_server, threadmill_backend, redis_url
):
    assert threadmill_backend is task_backends["default"]
    assert threadmill_backend.redis_url == threadmill_server.url != redis_url
    result = tasks.echo.enqueue("on the fixture's server")

    drained = drain()

    assert [r.return_value for r in drained.successful] == ["on the fixture's server"]
    assert redis.Redis.from_url(redis_url).dbsize() == 0
    assert threadmill_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_the_how_to_examples_pass_as_a_project_of_their_own():
    # Run as a project runs them: their own conftest enables the plugin, and no fixture of this suite is loaded.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(EXAMPLES)],
        cwd=EXAMPLES.parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout


def test_the_task_path_never_imports_the_testing_helper():
    code = (
        "import sys, django; django.setup(); "
        "from django.tasks import task_backends; import threadmill.worker.supervisor, threadmill.cli; "
        "task_backends['default']; print(sorted(m for m in sys.modules if m.startswith('threadmill.testing')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
