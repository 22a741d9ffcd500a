"""Progress and metadata in the task hash: the `report` script through its wrapper, and what reads and moves keep."""

from __future__ import annotations

import json

import pytest

from tests.backends.conftest import enqueue, finish
from tests.tasks import echo
from threadmill import TaskProgress
from threadmill.base import Segment

PROGRESS = json.dumps({"done": 3, "total": 10, "note": "three <b>down</b>"})


@pytest.fixture
def leased(backend):
    enqueue(backend, echo, 1)
    [result] = backend.acquire("default", worker="w")
    return result


def test_report_stores_progress_and_metadata_under_the_lease(backend, leased):
    assert backend.report([(leased.id, leased.lease_token, PROGRESS, '{"rows":3}', False)]) == [1]

    stored = backend.get_result(leased.id)
    assert stored.progress == TaskProgress(3, 10, "three <b>down</b>")
    assert stored.metadata == {"rows": 3}


def test_report_under_another_lease_is_refused_and_changes_nothing(backend, leased):
    assert backend.report([(leased.id, "not-the-token", PROGRESS, '{"rows":3}', True)]) == [0]

    stored = backend.get_result(leased.id)
    assert (stored.progress, stored.metadata) == (None, {})


def test_a_first_metadata_write_over_stored_metadata_returns_it_and_stores_only_the_progress(backend, leased):
    backend.report([(leased.id, leased.lease_token, "", '{"a":1,"b":1}', False)])

    replies = backend.report([(leased.id, leased.lease_token, PROGRESS, '{"b":2}', False)])

    assert replies == [b'{"a":1,"b":1}']
    stored = backend.get_result(leased.id)
    assert stored.metadata == {"a": 1, "b": 1}
    assert stored.progress == TaskProgress(3, 10, "three <b>down</b>")
    assert backend.report([(leased.id, leased.lease_token, "", '{"a":1,"b":2}', True)]) == [1]
    assert backend.get_result(leased.id).metadata == {"a": 1, "b": 2}


def test_acknowledge_keeps_the_reports(backend, leased):
    backend.report([(leased.id, leased.lease_token, PROGRESS, '{"rows":3}', False)])

    assert finish(backend, leased, "ok")

    stored = backend.get_result(leased.id)
    assert stored.segment is Segment.SUCCESSFUL
    assert (stored.progress.done, stored.metadata) == (3, {"rows": 3})
    assert backend.report([(leased.id, leased.lease_token, "", '{"late":1}', True)]) == [0]


def test_requeue_clears_the_progress_and_keeps_the_metadata(backend, leased):
    backend.report([(leased.id, leased.lease_token, PROGRESS, '{"rows":3}', False)])

    assert backend.requeue(leased)

    stored = backend.get_result(leased.id)
    assert (stored.segment, stored.progress, stored.metadata) == (Segment.READY, None, {"rows": 3})


def test_a_page_of_running_tasks_carries_their_progress_and_one_task_its_metadata(backend, leased):
    backend.report([(leased.id, leased.lease_token, PROGRESS, '{"rows":3}', False)])

    [row] = backend.peek("default", segment=Segment.RUNNING)
    [keyset_row] = backend.peek_page("default", segment=Segment.RUNNING).items
    task = backend.peek_task(leased.id)

    assert row.progress == keyset_row.progress == task.progress == TaskProgress(3, 10, "three <b>down</b>")
    assert (row.metadata, task.metadata) == ({}, {"rows": 3})


def test_delete_and_purge_leave_no_report_behind(backend, raw):
    ids = []
    for _ in range(2):
        enqueue(backend, echo, 1)
        [result] = backend.acquire("default", worker="w")
        backend.report([(result.id, result.lease_token, PROGRESS, '{"rows":3}', False)])
        finish(backend, result)
        ids.append(result.id)

    backend.delete(ids[:1])
    backend.purge("default", segment=Segment.SUCCESSFUL)

    assert [raw.exists(f"threadmill:{{default}}:task:{task_id}") for task_id in ids] == [0, 0]


def test_unreadable_reports_read_as_none_and_empty(backend, leased, raw):
    raw.hset(f"threadmill:{{default}}:task:{leased.id}", mapping={"reported_progress": "{", "metadata": "[1]"})

    stored = backend.get_result(leased.id)

    assert (stored.progress, stored.metadata) == (None, {})
