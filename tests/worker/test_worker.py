"""The worker pool as real processes against the real server: drain, order, shutdown, crashes, retries."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import psutil
import pytest
import redis
from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import run_worker, segment_counts, wait_until, worker_env
from threadmill.base import Segment
from threadmill.identity import WorkerName

pytestmark = pytest.mark.slow


def _records(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines()]


def _wait_until_started(backend, key: str) -> None:
    """Wait until a `counted` task runs on a consumer (leased is not enough: it may still be buffered)."""
    wait_until(lambda: backend.client.hget("test:runs", key), f"task {key!r} runs")


def _by_start(results):
    return sorted(results, key=lambda r: r.started_at)


def test_exit_empty_drains_every_task_and_exits_zero(backend):
    echoes = [tasks.echo.enqueue(i) for i in range(40)]
    sums = [tasks.add.enqueue(i, 1) for i in range(10)]
    failure = tasks.explode.enqueue("kaput")

    done = run_worker("-w", "2", "-t", "2", "--exit-empty")

    assert done.returncode == 0, done.stderr
    assert [backend.get_result(r.id).return_value for r in echoes] == list(range(40))
    assert [backend.get_result(r.id).return_value for r in sums] == list(range(1, 11))
    failed = backend.get_result(failure.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class_path == "builtins.RuntimeError"
    assert "RuntimeError: kaput" in failed.errors[-1].traceback
    counts = segment_counts(backend)
    assert (counts[Segment.READY], counts[Segment.RUNNING], counts[Segment.SUCCESSFUL]) == (0, 0, 50)


def test_exit_empty_on_empty_queues_exits_without_waiting_for_a_poll():
    done = run_worker("-w", "1", "--exit-empty")

    assert done.returncode == 0, done.stderr
    exit_line = next(r for r in _records(done.stderr) if "exits with code 0" in r["message"])
    seconds = float(exit_line["message"].split(" in ")[1].split(" s")[0])
    assert seconds < 0.5, exit_line


def test_a_worker_process_without_sentry_set_up_does_not_import_it(backend):
    # sentry-sdk is installed here; the site's settings do not call sentry_sdk.init.
    result = tasks.imported.enqueue("sentry_sdk")

    assert run_worker("-w", "1", "--exit-empty").returncode == 0

    assert backend.get_result(result.id).return_value is False


def test_log_lines_are_json_with_the_process_thread_and_task(backend):
    failure = tasks.explode.enqueue()

    done = run_worker("-w", "1", "--exit-empty")

    error = next(r for r in _records(done.stderr) if r["logger"] == "django.tasks")
    assert error["level"] == "ERROR"
    assert (error["task_id"], error["task_path"], error["thread"]) == (failure.id, "tests.tasks.explode", "consumer-1")
    assert "RuntimeError: boom" in error["traceback"]
    [name] = backend.get_result(failure.id).worker_ids
    worker = WorkerName.parse(name)
    assert (worker.host, worker.pid) == (os.uname().nodename, error["process"]) and worker.incarnation, name


def test_text_log_lines_carry_the_process_thread_and_task(backend):
    failure = tasks.explode.enqueue()

    done = run_worker("-w", "1", "--exit-empty", "--log-format", "text")

    error = next(line for line in done.stderr.splitlines() if " ERROR django.tasks " in line)
    assert f"consumer-1 task {failure.id} tests.tasks.explode]" in error
    assert "RuntimeError: boom" in done.stderr


def test_higher_priority_runs_first(backend):
    low = [tasks.echo.enqueue(i) for i in range(4)]
    high = [tasks.urgent.enqueue(i) for i in range(4)]

    assert run_worker("-w", "1", "-t", "1", "-q", "default", "--exit-empty").returncode == 0

    order = [r.id for r in _by_start(backend.get_result(r.id) for r in low + high)]
    assert order == [r.id for r in high + low]


def test_queues_take_turns_one_task_at_a_time(backend):
    defaults = [tasks.echo.enqueue(i) for i in range(4)]
    emails = [tasks.send_email.enqueue(f"{i}@example.com") for i in range(4)]

    assert run_worker("-w", "1", "-q", "default,emails", "--prefetch-count", "1", "--exit-empty").returncode == 0

    queues = [r.task.queue_name for r in _by_start(backend.get_result(r.id) for r in defaults + emails)]
    assert queues in (["default", "emails"] * 4, ["emails", "default"] * 4)


def _script_calls(backend) -> int:
    stats = backend.client.info("commandstats")
    return stats.get("cmdstat_evalsha", {}).get("calls", 0) + stats.get("cmdstat_eval", {}).get("calls", 0)


@pytest.mark.parametrize(
    ("prefetch", "calls_per_task"), [("auto", (0.005, 0.06)), ("4", (0.25, 0.35)), ("1", (1.0, 1.2))]
)
def test_a_drain_costs_one_acquire_per_batch_and_few_acknowledgements(backend, prefetch, calls_per_task):
    for i in range(400):
        tasks.echo.enqueue(i)
    backend.client.config_resetstat()

    assert (
        run_worker("-w", "1", "-t", "1", "-q", "default", "--prefetch-count", prefetch, "--exit-empty").returncode == 0
    )

    assert segment_counts(backend)[Segment.SUCCESSFUL] == 400
    # A fetch costs one acquire, of 4 or of 1, or sized by time hundreds of echo tasks after the
    # first 4; acknowledgements go out in batches apart from fetching.
    fewest, most = calls_per_task
    assert 400 * fewest <= _script_calls(backend) <= 400 * most


def _workload():
    return (
        [tasks.echo.enqueue(i) for i in range(12)]
        + [tasks.add.enqueue(i, i) for i in range(6)]
        + [tasks.explode.enqueue(str(i)) for i in range(3)]
        + [tasks.attempt_number.enqueue() for _ in range(3)]
    )


def _outcomes(backend, results):
    outcomes = Counter()
    for result in results:
        stored = backend.get_result(result.id)
        value = stored.return_value if stored.status == TaskResultStatus.SUCCESSFUL else None
        errors = tuple(e.exception_class_path for e in stored.errors)
        outcomes[(stored.task.module_path, tuple(stored.args), stored.status, json.dumps(value), errors)] += 1
    return outcomes


def test_prefetch_on_and_off_give_the_same_results(backend):
    outcomes = []
    for prefetch in ("1", "0"):
        results = _workload()
        assert run_worker("-w", "1", "-t", "2", "--prefetch-count", prefetch, "--exit-empty").returncode == 0
        outcomes.append(_outcomes(backend, results))
        backend.client.flushdb()
    assert outcomes[0] == outcomes[1]
    assert sum(outcomes[0].values()) == 24


def test_sigterm_hands_buffered_tasks_back_at_once_and_lets_running_ones_finish(backend, start_worker):
    results = [tasks.sleep_for.enqueue(0.5) for _ in range(20)]
    worker = start_worker("-w", "1", "-t", "2", "--prefetch-count", "8", "-q", "default")
    # Two running and eight buffered: every lease this process holds.
    wait_until(lambda: segment_counts(backend)[Segment.RUNNING] >= 10, "the buffer is full")

    assert worker.stop(signal.SIGTERM) == 0, worker.output

    counts = segment_counts(backend)
    assert counts[Segment.RUNNING] == 0
    assert 2 <= counts[Segment.SUCCESSFUL] <= 4
    assert counts[Segment.SUCCESSFUL] + counts[Segment.READY] == len(results)
    # Handed back without an attempt: no worker id, no error, never started.
    handed_back = backend.peek("default", segment="ready", count=50)
    assert all(not r.worker_ids and not r.errors and r.started_at is None for r in handed_back)
    assert "Traceback" not in worker.output


def test_sigterm_hands_back_a_task_still_running_at_the_shutdown_timeout(backend, start_worker):
    result = tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "--shutdown-timeout", "0.5", "-q", "default")
    _wait_until_started(backend, "long")
    stopped_at = time.monotonic()

    assert worker.stop(signal.SIGTERM) == 0, worker.output

    assert time.monotonic() - stopped_at < 0.5 + 3
    assert segment_counts(backend)[Segment.READY] == 1
    interrupted = backend.get_result(result.id)
    assert len(interrupted.worker_ids) == 1
    assert interrupted.errors[-1].exception_class_path == "threadmill.exceptions.AttemptAbandoned"
    assert "interrupted this attempt after 0.5 s" in interrupted.errors[-1].traceback
    # It said goodbye: nothing it held is left for the broker.
    assert backend.worker_heartbeats() == {}


def test_a_stopping_worker_names_the_tasks_it_waits_for_again_as_each_finishes(backend, start_worker):
    tasks.counted.enqueue("short", 2)
    tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "-t", "2", "-q", "default")
    _wait_until_started(backend, "short")
    _wait_until_started(backend, "long")

    worker.process.send_signal(signal.SIGTERM)

    def said(text: str) -> bool:
        return any(text in record["message"] for record in worker.records())

    wait_until(lambda: said("stopping: 2 tasks still running: tests.tasks.counted (2);"), "it names both", 3)
    wait_until(lambda: said("stopping: 1 task still running: tests.tasks.counted."), "it names the one left", 5)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(10) == 130


def test_a_second_sigterm_exits_at_once_and_leaves_the_lease_to_the_broker(backend, start_worker):
    tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "-q", "default")
    _wait_until_started(backend, "long")

    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in worker.output, "the pool starts a bounded stop")
    worker.process.send_signal(signal.SIGTERM)

    assert worker.process.wait(10) == 130
    assert segment_counts(backend)[Segment.RUNNING] == 1
    assert len(backend.worker_heartbeats()) == 1


def test_a_second_ctrl_c_exits_at_once_leaving_the_leases(backend, start_worker):
    tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "-q", "default")
    _wait_until_started(backend, "long")
    child = worker.children()[0]

    # A terminal's Ctrl-C reaches the supervisor only: its worker processes lead groups of their own.
    assert os.getpgid(child) == child
    worker.process.send_signal(signal.SIGINT)
    wait_until(lambda: "stopping" in worker.output, "the pool starts a graceful stop")
    worker.process.send_signal(signal.SIGINT)

    assert worker.process.wait(10) == 130
    wait_until(lambda: not psutil.pid_exists(child), "the worker process exits")
    assert segment_counts(backend)[Segment.RUNNING] == 1


def test_sigterm_then_sigint_to_the_supervisor_stops_every_process_at_once(backend, start_worker):
    import psutil

    tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "-q", "default")
    _wait_until_started(backend, "long")
    child = psutil.Process(worker.children()[0])

    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in worker.output, "the pool starts a graceful stop")
    worker.process.send_signal(signal.SIGINT)

    assert worker.process.wait(10) == 130
    child.wait(10)
    assert not child.is_running()
    assert segment_counts(backend)[Segment.RUNNING] == 1


def test_a_worker_process_whose_supervisor_died_stops(backend, start_worker):
    import psutil

    worker = start_worker("-w", "1", "-q", "default")
    child = psutil.Process(wait_until(worker.children, "the worker process starts")[0])

    worker.process.kill()

    child.wait(10)  # Not its parent, so the exit code is unknown here; the log says why it stopped.
    assert not child.is_running()
    assert "is gone; stopping" in worker.output


def test_kill_9_mid_drain_finishes_every_task_once_or_retries_it(backend, start_worker):
    results = [tasks.counted.enqueue(str(i), 0.01) for i in range(150)]
    worker = start_worker("-w", "2", "-t", "2", "-q", "default", env=worker_env(THREADMILL_TEST_LEASE_TTL="1.5"))
    wait_until(lambda: segment_counts(backend)[Segment.SUCCESSFUL] >= 20, "a drain is under way")
    victim = worker.children()[0]

    os.kill(victim, signal.SIGKILL)

    wait_until(lambda: segment_counts(backend)[Segment.SUCCESSFUL] == len(results), "every task finished", 90)
    assert worker.stop() == 0
    runs = {key.decode(): int(n) for key, n in backend.client.hgetall("test:runs").items()}
    retried = 0
    for result in results:
        stored = backend.get_result(result.id)
        errors = [e.exception_class_path for e in stored.errors]
        if stored.attempts == 1:
            assert (runs[stored.args[0]], errors) == (1, [])
        else:
            # Leased by the killed process: it ran there at most once, then once more here.
            retried += 1
            assert errors == ["threadmill.exceptions.AcknowledgementTimeout"]
            assert stored.attempts == 2 and WorkerName.parse(stored.worker_ids[0]).pid == victim
            assert runs.get(stored.args[0], 0) in (1, 2)
    assert retried > 0


def test_recycling_replaces_a_process_after_exactly_max_tasks(backend):
    results = [tasks.echo.enqueue(i) for i in range(23)]

    done = run_worker("-w", "1", "--max-tasks", "5", "--prefetch-count", "3", "--exit-empty")

    assert done.returncode == 0, done.stderr
    per_process = Counter(backend.get_result(r.id).worker_ids[0] for r in results)
    assert sorted(per_process.values()) == [3, 5, 5, 5, 5]
    assert sum("recycled" in r["message"] for r in _records(done.stderr)) == 4


def test_retries_wait_in_deferred_then_run_again(backend, start_worker):
    result = tasks.flaky.enqueue("again")

    assert run_worker("-w", "1", "--exit-empty").returncode == 0

    waiting = backend.get_result(result.id)
    assert waiting.segment == Segment.DEFERRED and waiting.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in waiting.errors] == ["builtins.ValueError"]
    worker = start_worker("-w", "1")
    final = wait_until(
        lambda: (r := backend.get_result(result.id)).status == TaskResultStatus.FAILED and r,
        "the retries are used up",
    )
    assert worker.stop() == 0
    assert [e.exception_class_path for e in final.errors] == ["builtins.ValueError"] * 3
    assert final.attempts == 3


def test_async_and_context_tasks_run_on_one_loop_per_thread(backend):
    loops = [tasks.event_loop_id.enqueue() for _ in range(3)]
    attempt = tasks.async_attempt.enqueue("x")
    sync_attempt = tasks.attempt_number.enqueue()
    echo = tasks.async_echo.enqueue({"a": [1, 2]})

    assert run_worker("-w", "1", "-t", "1", "--exit-empty").returncode == 0

    assert len({backend.get_result(r.id).return_value for r in loops}) == 1
    assert backend.get_result(attempt.id).return_value == [1, "x"]
    assert backend.get_result(sync_attempt.id).return_value == 1
    assert backend.get_result(echo.id).return_value == {"a": [1, 2]}


def test_a_fetch_failure_exits_the_process_and_the_supervisor_respawns_it(backend, start_worker):
    ready = backend.keys.segment("default", Segment.READY)
    backend.client.set(ready, "not a sorted set")
    worker = start_worker("-w", "1", "-q", "default")
    wait_until(lambda: worker.output.count("exited with code 1") >= 2, "the process failed twice")
    failures = [r for r in worker.records() if r["message"].startswith("A call to the server failed on queues default")]
    assert len({r["process"] for r in failures}) >= 2
    assert all("WRONGTYPE" in r["traceback"] for r in failures)

    backend.client.delete(ready)
    result = tasks.echo.enqueue("back")
    wait_until(
        lambda: backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, "a respawned process runs it"
    )
    assert worker.stop() == 0


def test_telemetry_publishes_running_snapshots_and_a_final_stopped_one(backend, start_worker):
    pubsub = redis.Redis.from_url(backend.redis_url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(backend.keys.telemetry())
    wait_until(lambda: pubsub.get_message(timeout=0.01) is None and pubsub.subscribed, "the subscription is live")
    for i in range(5):
        tasks.echo.enqueue(i)
    worker = start_worker("-w", "1", "-t", "2", "-q", "default")
    snapshots = []

    def snapshot_in(state: str):
        # None also stands for the subscription's confirmation, so read until the snapshot arrives.
        message = pubsub.get_message(timeout=0.1)
        if message is not None and (data := json.loads(message["data"]))["type"] == "worker":
            snapshots.append(data)
        return snapshots and snapshots[-1]["state"] == state and snapshots[-1]

    first = wait_until(lambda: snapshot_in("running"), "a running snapshot arrives at start", 10)
    running = wait_until(
        lambda: (s := snapshot_in("running")) and s["tasks_done"] == 5 and s, "a snapshot counts the tasks", 10
    )
    assert worker.stop() == 0
    stopped = wait_until(lambda: snapshot_in("stopped"), "the stopped snapshot arrives", 10)

    assert first["pid"] == running["pid"] == stopped["pid"] == WorkerName.parse(running["worker"]).pid
    assert (stopped["tasks_done"], stopped["threads"], stopped["busy_threads"], stopped["prefetch"]) == (
        5,
        2,
        0,
        "auto",
    )
    # Sized by time: 4 per thread until a task ran, then at least one per thread.
    assert first["buffer_size"] == 8 and 2 <= stopped["buffer_size"] <= 256 and stopped["task_run_seconds"] > 0
    assert running["queues"] == ["default"] and running["rss_bytes"] > 0 and running["tasks_per_minute"] > 0
    assert set(running) >= {"host", "buffer_fill", "cpu_percent", "started_at", "time", "backend"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "0"], "argument -w/--workers: must be a whole number of at least 1, not '0'"),
        (
            ["--prefetch-count", "-1"],
            "argument --prefetch-count: must be auto or a whole number of at least 1, not '-1'",
        ),
        (
            ["--prefetch-count", "some"],
            "argument --prefetch-count: must be auto or a whole number of at least 1, not 'some'",
        ),
        (["--prefetch-window", "0"], "argument --prefetch-window: must be a number of seconds above 0, not '0'"),
        (
            ["--prefetch-window", "0.1", "--prefetch-count", "8"],
            "CommandError: --prefetch-window sizes the buffer by time: it needs --prefetch-count auto, not a count.",
        ),
        (
            ["--prefetch-window", "900"],
            "CommandError: --prefetch-window 900 is more than 0.1 of the backend's lease_ttl",
        ),
        (["--threads", "many"], "argument -t/--threads: must be a whole number of at least 1, not 'many'"),
        (["--log-format", "xml"], "argument --log-format: invalid choice"),
        (["-q", "nowhere"], "CommandError: Unknown queue(s) nowhere; backend 'default' has default, emails, reports."),
        (["-b", "nowhere"], "CommandError: Unknown task backend 'nowhere'; TASKS defines default."),
        (["--max-tasks-jitter", "3"], "CommandError: --max-tasks-jitter needs --max-tasks."),
    ],
)
def test_a_bad_option_is_a_one_line_error(args, message):
    done = run_worker(*args)

    assert done.returncode != 0
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert message in done.stderr


def test_the_supervisor_kills_a_worker_process_that_outlives_its_shutdown_timeout(backend, start_worker):
    tasks.counted.enqueue("long", 30)
    worker = start_worker("-w", "1", "--shutdown-timeout", "0.5", "-q", "default")
    _wait_until_started(backend, "long")
    child = psutil.Process(worker.children()[0])
    child.suspend()  # A process that cannot hand back or exit.
    stopped_at = time.monotonic()

    assert worker.stop(signal.SIGTERM) == 0

    assert time.monotonic() - stopped_at < 0.5 + 3 + 2
    child.wait(5)
    assert not child.is_running()
    assert "did not stop within its shutdown timeout; killing it" in worker.output
