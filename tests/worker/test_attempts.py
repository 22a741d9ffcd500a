"""Attempt records: each attempt a real worker runs is recorded (worker, lease, start, end, outcome, error)."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.worker.conftest import run_worker, wait_until
from threadmill.attempts import ATTEMPTS_KEPT, attempt_record, attempts_of
from threadmill.outcome import mark_successful

pytestmark = pytest.mark.slow


def test_each_attempt_of_a_retried_task_is_recorded_in_order(backend, start_worker):
    result = tasks.flaky.enqueue("again")
    worker = start_worker("-w", "1")
    final = wait_until(
        lambda: (r := backend.get_result(result.id)).status == TaskResultStatus.FAILED and r, "the retries are used up"
    )
    assert worker.stop() == 0

    records = final.attempt_records
    assert [a.outcome for a in records] == ["failed"] * 3
    assert [a.worker for a in records] == final.worker_ids
    assert all(a.error == "ValueError: again" for a in records)
    for attempt in records:
        assert attempt.leased_at <= attempt.started_at <= attempt.ended_at
        assert attempt.duration.total_seconds() < 5
    # A retry waits its backoff (0.05 s, then 0.1 s) in deferred before its next lease.
    assert records[1].leased_at >= records[0].ended_at and records[2].leased_at >= records[1].ended_at
    assert records[0].started_at >= final.enqueued_at


def test_a_successful_run_records_one_attempt_and_an_unstarted_release_records_none(backend):
    result = tasks.echo.enqueue("x")
    leased = backend.acquire("default", count=1, worker="w-1", token_base="t")
    assert backend.release(leased) == 1

    assert run_worker("-w", "1", "-t", "1", "--exit-empty").returncode == 0

    done = backend.get_result(result.id)
    assert [(a.outcome, a.error) for a in done.attempt_records] == [("successful", "")]
    assert done.attempt_records[0].worker == done.worker_ids[0] != "w-1"


def test_a_reaped_lease_is_recorded_as_abandoned_with_the_reason(backend):
    from threadmill.backends.broker import RedisBroker

    result = tasks.explode.enqueue()
    backend.acquire("default", count=1, worker="w-gone", token_base="t")
    backend.client.zadd(backend.keys.segment("default", "running"), {result.id: 0})  # the lease ran out

    assert RedisBroker(backend, ["default"]).reap("default") == 1

    (attempt,) = backend.get_result(result.id).attempt_records
    assert attempt.worker == "w-gone" and attempt.outcome == "abandoned"
    assert attempt.started_at is None and attempt.leased_at is not None
    assert "expired" in attempt.error


def test_a_console_requeue_of_a_running_task_records_its_lease_as_requeued(backend):
    result = tasks.echo.enqueue()
    backend.acquire("default", count=1, worker="w-1", token_base="t")

    assert backend.requeue(result.id)

    (attempt,) = backend.get_result(result.id).attempt_records
    assert (attempt.worker, attempt.outcome, attempt.started_at) == ("w-1", "requeued", None)
    assert attempt.ended_at >= attempt.leased_at


def test_a_task_keeps_only_its_last_attempt_records(backend):
    result = tasks.echo.enqueue()
    key = backend.keys.task(result.id)
    for i in range(ATTEMPTS_KEPT + 3):
        (leased,) = backend.acquire("default", count=1, worker=f"w-{i}", token_base=f"t{i}")
        assert backend.requeue(leased)

    workers = [a.worker for a in attempts_of(backend.client.hget(key, "attempts"))]
    assert workers == [f"w-{i}" for i in range(3, ATTEMPTS_KEPT + 3)]


def test_records_this_code_cannot_read_are_left_out(backend):
    result = tasks.echo.enqueue()
    good = json.dumps(["w-1", time.time(), None, None, "requeued", ""])
    stored = f'not json\n[1,2]\n["<b>",1e300,"x",null,"a",""]\n{good}'
    backend.client.hset(backend.keys.task(result.id), "attempts", stored)

    records = backend.get_result(result.id).attempt_records
    assert [(a.worker, a.leased_at is None) for a in records] == [("<b>", True), ("w-1", False)]


def test_a_run_a_time_limit_or_an_abort_ended_is_recorded_as_such(backend):
    from datetime import UTC, datetime

    from threadmill.exceptions import TaskTimeout
    from threadmill.outcome import cancelled_error, error_of, mark_failed

    timed_out, aborted = tasks.echo.enqueue(1), tasks.echo.enqueue(2)
    leased = {r.id: r for r in backend.acquire("default", count=2, worker="w-1", token_base="t")}
    ran = leased[timed_out.id].lease_started_at.timestamp()
    object.__setattr__(leased[timed_out.id], "ran", (ran, ran + 2))
    mark_failed(leased[timed_out.id], error_of(TaskTimeout("Past 2 s.")), datetime.now(UTC))
    mark_failed(leased[aborted.id], cancelled_error("Cancelled by ops."), datetime.now(UTC))

    assert backend.acknowledge_many([(r, None) for r in leased.values()]) == [True, True]

    (limit,) = backend.get_result(timed_out.id).attempt_records
    (abort,) = backend.get_result(aborted.id).attempt_records
    assert (limit.outcome, limit.duration.total_seconds()) == ("timed out", 2)
    assert limit.error == "threadmill.exceptions.TaskTimeout: Past 2 s."
    assert (abort.outcome, abort.started_at) == ("cancelled", None)
    assert abort.error == "threadmill.exceptions.TaskCancelled: Cancelled by ops."


def test_the_records_of_one_acquires_leases_share_their_opening_encoded_once(backend):
    for i in range(3):
        tasks.echo.enqueue(i)
    leased = backend.acquire("default", count=3, worker='w "quoted"')
    for i, result in enumerate(leased):
        mark_successful(result, datetime.now(UTC))
        object.__setattr__(result, "ran", (1764650000.25 + i, 1764650000.5 + i))
    timestamps = 0

    def count(frame, event, arg):
        nonlocal timestamps
        if event == "c_call" and getattr(arg, "__name__", "") == "timestamp":
            timestamps += 1

    sys.setprofile(count)
    try:
        records = [attempt_record(result) for result in leased]
    finally:
        sys.setprofile(None)

    leased_at = leased[0].lease_started_at.timestamp()
    assert [json.loads(record) for record in records] == [
        ['w "quoted"', leased_at, 1764650000.25 + i, 1764650000.5 + i, "successful", ""] for i in range(3)
    ]
    assert timestamps == 1
