"""`task.enqueue_on_commit`: the task is stored once the database transaction commits, never when it rolls back."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from tests.tasks import echo
from threadmill.base import Segment

pytestmark = pytest.mark.django_db(transaction=True)


def _ready_args(backend) -> list:
    return [result.args for result in backend.peek("default", segment=Segment.READY, count=100)]


@pytest.fixture
def tasks_backend(redis_url):
    backend = echo.get_backend()
    backend.purge("default", segment=Segment.READY)
    yield backend
    backend.purge("default", segment=Segment.READY)


def _write_row(value: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS on_commit_rows (value integer)")
        cursor.execute("INSERT INTO on_commit_rows (value) VALUES (%s)", [value])


def test_a_task_enqueued_on_commit_is_stored_only_after_the_transaction_commits(tasks_backend):
    with transaction.atomic():
        _write_row(1)
        echo.enqueue_on_commit(1)
        assert _ready_args(tasks_backend) == []  # inside the transaction: not yet
    assert _ready_args(tasks_backend) == [[1]]


def test_a_rolled_back_transaction_enqueues_nothing(tasks_backend):
    with pytest.raises(RuntimeError, match="the view failed"), transaction.atomic():
        _write_row(2)
        echo.enqueue_on_commit(2)
        raise RuntimeError("the view failed")
    assert _ready_args(tasks_backend) == []


def test_outside_a_transaction_it_enqueues_at_once_and_keyword_arguments_pass_through(tasks_backend):
    echo.enqueue_on_commit(value={"a": [1]})
    [result] = tasks_backend.peek("default", segment=Segment.READY, count=10)
    assert result.kwargs == {"value": {"a": [1]}}


def test_arguments_that_are_not_json_raise_at_the_call_and_nothing_is_stored_at_the_commit(tasks_backend):
    with transaction.atomic(), pytest.raises(TypeError):
        echo.enqueue_on_commit(object())
    assert _ready_args(tasks_backend) == []


def test_the_arguments_are_taken_at_the_call_not_at_the_commit(tasks_backend):
    value = [1]
    with transaction.atomic():
        echo.enqueue_on_commit(value)
        value.append(2)
    assert _ready_args(tasks_backend) == [[[1]]]
