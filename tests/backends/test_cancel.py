"""The backend's cancel: a ready or deferred task finishes FAILED before it runs; a running one is asked to abort."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

from tests.backends.conftest import enqueue, finish
from tests.tasks import echo
from threadmill.backends.tooling.actions import CancelOutcome
from threadmill.base import Segment
from threadmill.exceptions import UnreadableTaskError

CANCELLED = "threadmill.exceptions.TaskCancelled"


def test_cancel_of_a_ready_task_finishes_it_failed_with_who_and_when(backend):
    result = enqueue(backend, echo, 1)

    assert backend.cancel(result.id, by="ops on box") is True

    stored = backend.get_result(result.id)
    assert stored.status == TaskResultStatus.FAILED and stored.segment is Segment.FAILED
    [error] = stored.errors
    assert error.exception_class_path == CANCELLED
    assert f"Task {result.id} was cancelled by ops on box at " in error.traceback
    assert "before it ran" in error.traceback
    assert stored.worker_ids == [] and stored.finished_at is not None
    assert backend.in_segment("default", Segment.READY, [result.id]) == []
    assert backend.in_segment("default", Segment.FAILED, [result.id]) == [result.id]
    assert backend.acquire("default", count=10) == []


def test_cancel_of_a_deferred_task_takes_it_out_so_the_mover_never_promotes_it(backend):
    result = backend.enqueue(echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), (1,), {})

    assert backend.cancel(result.id) is True

    assert backend.in_segment("default", Segment.DEFERRED, [result.id]) == []
    assert backend.scripts.promote("default", 10)[0] == 0
    assert backend.acquire("default", count=10) == []
    assert backend.get_result(result.id).status == TaskResultStatus.FAILED


def test_cancel_without_by_names_this_process_s_user_and_host(backend):
    import socket

    result = enqueue(backend, echo, 1)
    backend.cancel(result.id)
    assert f"on {socket.gethostname()} at " in backend.get_result(result.id).errors[0].traceback


def test_cancel_of_a_running_task_stores_an_abort_request_and_leaves_its_lease(backend, raw):
    enqueue(backend, echo, 1)
    [leased] = backend.acquire("default", worker="w:1:aaaa")

    assert backend.cancel(leased.id, by="ops") is True

    key = backend.keys.task(leased.id)
    request = json.loads(raw.hget(key, "abort_requested"))
    assert request["by"] == "ops" and request["at"] > 0
    assert raw.hget(key, "lease_token").decode() == leased.lease_token
    assert backend.get_result(leased.id).status == TaskResultStatus.RUNNING
    assert backend.aborts_requested([leased]) == {leased.lease_token: request}


def test_a_second_cancel_of_a_running_task_keeps_the_first_request(backend, raw):
    enqueue(backend, echo, 1)
    [leased] = backend.acquire("default")
    backend.cancel(leased.id, by="first")
    backend.cancel(leased.id, by="second")
    assert json.loads(raw.hget(backend.keys.task(leased.id), "abort_requested"))["by"] == "first"


def test_a_task_leased_between_the_read_and_the_script_gets_an_abort_request_not_a_lost_update(backend, raw):
    result = enqueue(backend, echo, 1)
    [leased] = backend.acquire("default")
    # As the cancel read it before acquire leased it: ready, with its failed document built.
    document = json.dumps({"stale": True})
    reply = backend.task_scripts(result.id).cancel(result.id, "default", "ready", document, 60, '{"by":"x"}', 0)

    assert reply == 2
    assert backend.get_result(result.id).status == TaskResultStatus.RUNNING
    assert raw.hget(backend.keys.task(result.id), "result") is None
    assert finish(backend, leased, 5) is True
    assert backend.get_result(result.id).return_value == 5


def test_cancel_of_a_finished_task_is_false_and_changes_nothing(backend):
    enqueue(backend, echo, 1)
    [leased] = backend.acquire("default")
    finish(backend, leased, 7)

    assert backend.cancel(leased.id) is False

    stored = backend.get_result(leased.id)
    assert stored.status == TaskResultStatus.SUCCESSFUL and stored.return_value == 7 and stored.errors == []


def test_cancel_of_an_unknown_id_raises_task_result_does_not_exist(backend):
    with pytest.raises(TaskResultDoesNotExist, match="No task with id 'nope' is stored."):
        backend.cancel("nope")


def test_cancel_of_an_unreadable_task_raises_and_leaves_it_quarantined(backend, raw):
    result = enqueue(backend, echo, 1)
    raw.hset(backend.keys.task(result.id), "data", b"\xff not json")
    with pytest.raises(UnreadableTaskError, match="cannot be cancelled"):
        backend.cancel(result.id)
    assert backend.in_segment("default", Segment.READY, [result.id]) == [result.id]


def test_cancel_many_returns_the_ids_it_cancelled_or_asked_to_abort(backend):
    enqueue(backend, echo, 1)
    [running] = backend.acquire("default")
    enqueue(backend, echo, 2)
    [done] = backend.acquire("default")
    finish(backend, done)
    ready = enqueue(backend, echo, 3)

    took = backend.cancel_many([ready.id, running.id, done.id, "nope"])

    assert took == [ready.id, running.id]
    assert backend.cancel_outcome("nope") is CancelOutcome.UNKNOWN
    assert backend.cancel_outcome(done.id) is CancelOutcome.ALREADY_FINISHED


def test_cancelled_tasks_are_counted_in_the_queue_s_totals(backend, raw):
    for i in range(3):
        backend.cancel(enqueue(backend, echo, i).id)
    totals = raw.hgetall(backend.keys.totals("default"))
    assert int(totals[b"cancelled"]) == 3 and int(totals[b"failed"]) == 3 and int(totals[b"finished"]) == 3
