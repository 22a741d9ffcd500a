"""Payloads this code cannot read: caught by one rule on every path, quarantined, never deleted."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from tests.backends.conftest import enqueue
from tests.tasks import echo, flaky
from threadmill.backends import codec
from threadmill.backends.broker import RedisBroker
from threadmill.base import UNREADABLE_PAYLOAD_ERRORS, Segment, UnreadableTask


def _edit(change):
    """Return a poison that rewrites the valid stored document with `change`."""

    def poison(document: bytes) -> bytes:
        doc = json.loads(document)
        change(doc)
        return json.dumps(doc).encode()

    return poison


POISONS = {
    "not utf-8": b"\xff\xfe\x00 not text",
    "not json": b"{this is not json",
    "json that is not a task result": b"[1, 2, 3]",
    "task module gone": _edit(lambda d: d["task"].update(path="tests.module_that_was_deleted.echo")),
    "task function gone": _edit(lambda d: d["task"].update(path="tests.tasks.function_that_was_deleted")),
    "retry callback gone": _edit(lambda d: d["task"].update(retry="tests.tasks.policy_that_was_deleted")),
    "unknown status": _edit(lambda d: d.update(status="EXPLODED")),
    "required field missing": _edit(lambda d: d.pop("args")),
    "malformed error entry": _edit(lambda d: d.update(errors=[{"traceback": "no class path"}])),
}


def _apply_poison(raw, task_id: str, poison) -> bytes:
    key = f"threadmill:{{default}}:task:{task_id}"
    payload = poison if isinstance(poison, bytes) else poison(raw.hget(key, "data"))
    raw.hset(key, "data", payload)
    return payload


def _assert_quarantined(raw, task_id: str, payload: bytes) -> None:
    key = f"threadmill:{{default}}:task:{task_id}"
    assert raw.zrange("threadmill:{default}:default:unreadable", 0, -1) == [task_id.encode()]
    assert raw.hget(key, "data") == payload
    assert raw.hget(key, "segment") == b"unreadable"
    assert raw.hget(key, "read_error")
    assert raw.hget(key, "lease_token") is None


@pytest.mark.parametrize("case", POISONS)
def test_acquire_quarantines_an_unreadable_payload(backend, raw, case, caplog):
    bad = enqueue(backend, echo, 1)
    good = enqueue(backend, echo, 2)
    payload = _apply_poison(raw, bad.id, POISONS[case])
    with caplog.at_level(logging.ERROR, logger="threadmill.backend"):
        got = backend.acquire("default", count=5, worker="w")
    assert [r.id for r in got] == [good.id]
    _assert_quarantined(raw, bad.id, payload)
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert bad.id in caplog.records[0].getMessage()


@pytest.mark.parametrize("case", POISONS)
def test_reaper_quarantines_an_unreadable_payload(backend, raw, case):
    bad = enqueue(backend, flaky)
    backend.acquire("default", worker="w")
    payload = _apply_poison(raw, bad.id, POISONS[case])
    raw.zadd("threadmill:{default}:default:running", {bad.id: 1})
    assert RedisBroker(backend, ["default"]).reap("default") == 1
    _assert_quarantined(raw, bad.id, payload)


@pytest.mark.parametrize("case", POISONS)
def test_peek_returns_an_unreadable_task_and_renders_the_rest(backend, raw, case):
    before = enqueue(backend, echo, 1)
    bad = enqueue(backend, echo, 2)
    after = enqueue(backend, echo, 3)
    payload = _apply_poison(raw, bad.id, POISONS[case])
    page = backend.peek("default", segment="ready")
    assert page.total == 3
    assert [r.id for r in page] == [before.id, bad.id, after.id]
    assert isinstance(page[1], UnreadableTask)
    assert page[1].raw == payload
    assert page[1].error
    _assert_quarantined(raw, bad.id, payload)


@pytest.mark.parametrize("case", POISONS)
def test_get_result_of_an_unreadable_task_names_it(backend, raw, case):
    from threadmill.exceptions import UnreadableTaskError

    bad = enqueue(backend, echo, 1)
    _apply_poison(raw, bad.id, POISONS[case])
    with pytest.raises(UnreadableTaskError, match=bad.id):
        backend.get_result(bad.id)


def test_every_listed_error_is_reachable_from_a_payload(backend, raw):
    raised = set()
    for poison in POISONS.values():
        bad = enqueue(backend, echo, 1)
        payload = _apply_poison(raw, bad.id, poison)
        with pytest.raises(UNREADABLE_PAYLOAD_ERRORS) as info:
            codec.decode(payload, Segment.READY)
        raised.add(info.type)
    for member in UNREADABLE_PAYLOAD_ERRORS:
        assert any(issubclass(kind, member) for kind in raised), member


def test_an_unreadable_task_can_be_requeued_without_parsing_it(backend, raw):
    bad = enqueue(backend, echo, 1)
    payload = _apply_poison(raw, bad.id, POISONS["not json"])
    backend.acquire("default", worker="w")
    assert backend.requeue(bad.id)
    key = f"threadmill:{{default}}:task:{bad.id}"
    assert raw.hget(key, "data") == payload
    assert raw.hget(key, "segment") == b"ready"
    assert raw.hget(key, "read_error") is None


def test_the_reaper_only_logs_a_payload_that_is_already_gone(backend, raw, caplog):
    gone = enqueue(backend, echo, 1)
    backend.acquire("default", worker="w")
    raw.delete(f"threadmill:{{default}}:task:{gone.id}")
    raw.zadd("threadmill:{default}:default:running", {gone.id: 1})
    with caplog.at_level(logging.INFO, logger="threadmill.broker"):
        assert RedisBroker(backend, ["default"]).reap("default") == 0
    assert "already gone" in caplog.text
    assert raw.zcard("threadmill:{default}:default:running") == 0
    assert raw.zcard("threadmill:{default}:default:unreadable") == 0


def test_requeue_of_a_running_unreadable_task_keeps_its_payload_and_logs_the_attempt(backend, raw, caplog):
    result = enqueue(backend, echo, 1)
    backend.acquire("default", worker="host:1")
    raw.hset(f"threadmill:{{default}}:task:{result.id}", "data", b"\xff not json")
    assert backend.requeue(result.id)
    assert raw.hget(f"threadmill:{{default}}:task:{result.id}", "data") == b"\xff not json"
    assert raw.hget(f"threadmill:{{default}}:task:{result.id}", "segment") == b"ready"
    assert f"Task {result.id} on queue default was requeued while worker host:1 ran it" in caplog.text


def test_a_peek_that_read_a_ready_task_unreadable_leaves_it_to_the_worker_that_acquired_it_since(backend, raw):
    bad = enqueue(backend, echo, 1)
    payload = _apply_poison(raw, bad.id, POISONS["not json"])
    # The console's peek read it ready; before its quarantine ran, a worker's acquire script leased it.
    backend.scripts.acquire(["default"], 1, "w", 30, "tok")
    error = ValueError("not json")

    backend.quarantine_unreadable(bad.id, "default", Segment.READY, error, "", "peek")

    assert raw.hget(f"threadmill:{{default}}:task:{bad.id}", "segment") == b"running"
    backend.quarantine_unreadable(bad.id, "default", Segment.RUNNING, error, "tok:1", "acquire")
    _assert_quarantined(raw, bad.id, payload)
    assert raw.zcard("threadmill:{default}:default:running") == 0


def test_a_peek_that_read_a_deferred_task_unreadable_leaves_it_once_promoted(backend, raw):
    bad = enqueue(backend, echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), 1)
    _apply_poison(raw, bad.id, POISONS["not json"])
    raw.zadd("threadmill:{default}:default:deferred", {bad.id: 1})
    backend.scripts.promote("default", 10)  # between the peek's read and its quarantine

    backend.quarantine_unreadable(bad.id, "default", Segment.DEFERRED, ValueError("not json"), "", "peek")

    assert raw.zrange("threadmill:{default}:default:ready", 0, -1) == [bad.id.encode()]
    assert raw.hget(f"threadmill:{{default}}:task:{bad.id}", "segment") == b"ready"
    assert raw.zcard("threadmill:{default}:default:unreadable") == 0
