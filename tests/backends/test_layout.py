"""The layout version per alias: recorded, upgraded from version 1, and a newer one refused everywhere."""

from __future__ import annotations

import pytest
from django.tasks import TaskResultStatus

from tests.backends.conftest import finish
from tests.layouts import LAYOUT, refusal
from tests.tasks import echo
from threadmill.backends.layout import UNPARTITIONED_LAYOUT
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import LayoutVersionError


@pytest.fixture
def fresh(server):
    """A new backend instance on the server (it has not checked the layout yet) and a raw client on the alias's node."""
    return RedisTaskBackend("default", server.params()), server.client_for(LAYOUT)


@pytest.mark.single_partition
def test_a_new_alias_records_the_current_layout(fresh):
    backend, raw = fresh
    backend.check_layout()
    assert UNPARTITIONED_LAYOUT == 2
    assert raw.get(LAYOUT) == b"2"


@pytest.mark.single_partition
def test_an_alias_with_version_1_data_and_no_layout_is_upgraded_in_place_and_its_results_still_read(fresh):
    backend, raw = fresh
    waiting = backend.enqueue(echo, ["waiting"], {})
    done = backend.enqueue(echo, ["done"], {})
    [leased] = backend.acquire("default", worker="w:1")
    assert leased.id == waiting.id
    assert finish(backend, leased, "the return value")
    # Layout 1 kept the finished task's document in a key of its own, not in the task hash.
    task_key, result_key = f"threadmill:{{default}}:task:{leased.id}", f"threadmill:{{default}}:result:{leased.id}"
    document = raw.hget(task_key, "result")
    raw.hdel(task_key, "result")
    raw.set(result_key, document, ex=60)
    assert raw.get(LAYOUT) is None  # enqueue and acknowledge do not check: layout 1 data looks like this

    backend.check_layout()

    assert raw.get(LAYOUT) == b"2"
    assert raw.get(result_key) == document  # nothing moved
    finished = backend.get_result(leased.id)
    assert (finished.status, finished.return_value) == (TaskResultStatus.SUCCESSFUL, "the return value")
    assert backend.get_result(done.id).args == ["done"]


@pytest.mark.single_partition
def test_a_stored_version_1_is_upgraded_to_2(fresh):
    backend, raw = fresh
    raw.set(LAYOUT, 1)
    backend.check_layout()
    assert raw.get(LAYOUT) == b"2"


@pytest.mark.parametrize("stored", ["99", "v3"])
def test_a_layout_this_code_does_not_know_is_refused_and_left_alone(fresh, stored):
    backend, raw = fresh
    raw.set(LAYOUT, stored)
    with pytest.raises(LayoutVersionError) as caught:
        backend.check_layout()
    assert str(caught.value) == refusal(stored)
    assert raw.get(LAYOUT) == stored.encode()


def test_the_layout_is_checked_once_per_backend_instance(fresh, server):
    backend, raw = fresh
    backend.check_layout()
    raw.set(LAYOUT, 99)
    backend.check_layout()  # a process checks when it starts, not on every call
    with pytest.raises(LayoutVersionError):
        RedisTaskBackend("default", server.params()).check_layout()
