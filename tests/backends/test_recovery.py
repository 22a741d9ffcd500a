"""Heartbeats and what the broker does with them: the scripts, then the recovery of a dead worker's leases."""

from __future__ import annotations

import json

import pytest
from django.tasks import TaskResultStatus

from tests.backends.conftest import enqueue
from tests.tasks import echo
from threadmill.backends.broker import RedisBroker
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import BackendConnectionError
from threadmill.outcome import WORKER_LOSS_LIMIT

T = "threadmill:{default}:task:"
Q = "threadmill:{default}:default:"
WORKERS = "threadmill:{default}:workers"


def _server_now(raw) -> float:
    seconds, micros = raw.time()
    return seconds + micros / 1e6


def _age_heartbeat(raw, worker: str, seconds: float) -> None:
    """Make a worker's last heartbeat `seconds` old by the server's clock."""
    raw.zadd(WORKERS, {worker: _server_now(raw) - seconds})


def _age_lease(raw, task_id: str, seconds: float, lease_ttl: float = 3600) -> None:
    """Make a lease `seconds` old by the server's clock, its deadline too, as if it had been taken then."""
    started = _server_now(raw) - seconds
    raw.hset(T + task_id, "lease_started_at", f"{started:.6f}")
    raw.zadd(Q + "running", {task_id: started + lease_ttl})


@pytest.fixture
def short(server) -> RedisTaskBackend:
    """A backend with a short worker timeout, as a test would configure it."""
    return RedisTaskBackend(
        "default", server.params(OPTIONS={"worker_timeout": 2, "socket_timeout": 1, "batch_size": 7})
    )


@pytest.fixture
def broker(short) -> RedisBroker:
    """A broker that already trusts heartbeats (it has reached the server long enough)."""
    broker = RedisBroker(short, ["default"])
    broker._reachable_since = float("-inf")
    return broker


# -- the scripts ------------------------------------------------------------------------


def test_a_heartbeat_stores_the_server_time_and_the_document_and_publishes_it(short, raw):
    # Through the backend's own subscription: classic pub/sub, or sharded on a cluster.
    subscription = short.subscribe_telemetry(["threadmill:{default}:telemetry"])
    assert subscription.next_message(timeout=1) is None  # the subscription's confirmation

    now = short.heartbeat("h:1", {"type": "worker", "running": ["a"]})

    assert abs(now - _server_now(raw)) < 1
    assert raw.zscore(WORKERS, "h:1") == pytest.approx(now)
    assert json.loads(raw.get("threadmill:{default}:worker:h:1")) == {"type": "worker", "running": ["a"]}
    assert 0 < raw.ttl("threadmill:{default}:worker:h:1") <= 3600 + 2
    channel, payload = subscription.next_message(timeout=2)
    subscription.close()
    assert channel == "threadmill:{default}:telemetry"
    assert json.loads(payload) == {"type": "worker", "running": ["a"]}
    assert short.worker_heartbeats() == {"h:1": pytest.approx(now)}


def test_a_goodbye_removes_the_worker_and_its_document(short, raw):
    short.heartbeat("h:1", {"type": "worker"})
    short.heartbeat("h:1", None)
    assert raw.zcard(WORKERS) == 0
    assert short.worker_document("h:1") is None


def test_claim_abandoned_takes_only_the_leases_of_workers_whose_heartbeat_is_stale(short, raw):
    for i in range(3):
        enqueue(short, echo, i)
    dead = short.acquire("default", count=2, worker="h:dead")
    alive = short.acquire("default", worker="h:alive")
    _age_heartbeat(raw, "h:dead", 10)
    _age_heartbeat(raw, "h:alive", 0)

    reply = short.scripts.claim_abandoned("default", 2, 3600, 100, 1000, 60, "claim")

    rows = [reply[i : i + 9] for i in range(1, len(reply), 9)]
    assert sorted(row[0].decode() for row in rows) == sorted(r.id for r in dead)
    assert {row[2] for row in rows} == {b"h:dead"}
    assert all(9 < float(row[6]) < 12 for row in rows)
    assert {raw.hget(T + r.id, "lease_token") for r in dead} == {b"claim:1", b"claim:2"}
    assert raw.hget(T + alive[0].id, "lease_token").decode() == alive[0].lease_token


def test_claim_abandoned_leaves_a_worker_that_never_sent_a_heartbeat_alone(short, raw):
    enqueue(short, echo)
    short.acquire("default", worker="h:script")
    assert short.scripts.claim_abandoned("default", 2, 3600, 100, 1000, 60, "claim")[1:] == []


def test_claim_abandoned_forgets_workers_dead_for_longer_than_any_lease(short, raw):
    _age_heartbeat(raw, "h:old", 5000)
    _age_heartbeat(raw, "h:recent", 10)
    short.scripts.claim_abandoned("default", 2, 3600, 100, 1000, 60, "claim")
    assert raw.zrange(WORKERS, 0, -1) == [b"h:recent"]


def _suspects(short, broker, raw, count: int = 1) -> list:
    """Enqueue tasks and lose the worker they were leased to, whose last heartbeat saw them buffered."""
    results = [enqueue(short, echo, i) for i in range(count)]
    short.acquire("default", count=count, worker="h:lost")
    short.heartbeat("h:lost", {"running": [], "buffered": [r.id for r in results]})
    _age_heartbeat(raw, "h:lost", 3)
    broker.run_once()
    assert {short.get_result(r.id).segment for r in results} == {Segment.READY}
    return results


def _claim_rows(short) -> dict[str, list]:
    reply = short.scripts.claim_abandoned("default", 2, 3600, 100, 1000, 60, "claim")
    return {reply[i].decode(): reply[i : i + 9] for i in range(1, len(reply), 9)}


def test_claim_abandoned_makes_every_task_of_a_lost_lease_a_suspect_that_may_have_run(short, raw):
    for i in range(2):
        enqueue(short, echo, i)
    leased = short.acquire("default", count=2, worker="h:dead")
    _age_heartbeat(raw, "h:dead", 10)

    rows = _claim_rows(short)

    # No record: whatever its heartbeat said, each may have run.
    assert {task_id: (row[7], row[8]) for task_id, row in rows.items()} == {r.id: (b"", 1) for r in leased}
    assert {raw.hget(T + r.id, "worker_losses") for r in leased} == {b"1"}


def test_acquire_leases_a_suspect_with_a_progress_record_and_returns_its_losses(short, broker, raw):
    [suspect] = _suspects(short, broker, raw)
    other = enqueue(short, echo, 2)

    leased = {r.id: r for r in short.acquire("default", count=2, worker="h:new")}

    assert leased[suspect.id].worker_losses == 1 and leased[other.id].worker_losses is None
    assert raw.hget(T + suspect.id, "progress").decode() == f"{leased[suspect.id].lease_token} leased"
    assert raw.hget(T + other.id, "progress") is None


def test_record_progress_is_fenced_by_the_lease_token_and_a_finish_ends_the_suspicion(short, broker, raw):
    [suspect] = _suspects(short, broker, raw)
    [leased] = short.acquire("default", worker="h:new")
    token = leased.lease_token

    assert short.scripts.record_progress(suspect.id, "taken-over", "started") == 0
    assert raw.hget(T + suspect.id, "progress").decode() == f"{token} leased"
    assert short.scripts.record_progress(suspect.id, token, "started") == 1
    assert raw.hget(T + suspect.id, "progress").decode() == f"{token} started"
    assert raw.hget(T + suspect.id, "worker_losses") == b"1"
    assert short.scripts.record_progress(suspect.id, token, "finished") == 1
    assert raw.hmget(T + suspect.id, "progress", "worker_losses") == [f"{token} finished".encode(), None]


def test_record_progress_of_a_task_that_is_gone_writes_nothing(short, raw):
    assert short.scripts.record_progress("no-such-task", "tok:1", "started") == 0
    assert raw.exists(T + "no-such-task") == 0


def test_record_progress_refuses_an_unknown_stage_with_a_clear_error(short):
    with pytest.raises(BackendConnectionError, match='record_progress takes "started" or "finished", not halfway'):
        short.scripts.record_progress("id", "tok:1", "halfway")


def test_claim_abandoned_counts_a_loss_by_what_the_lease_recorded(short, broker, raw):
    suspects = _suspects(short, broker, raw, 4)
    leased = {r.id: r for r in short.acquire("default", count=4, worker="h:dead")}
    never, started, finished, stale = (leased[s.id] for s in suspects)
    short.record_progress(started, "started")
    short.record_progress(finished, "started")
    short.record_progress(finished, "finished")
    raw.hset(T + stale.id, "progress", "an-earlier-lease:1 started")  # leased by a worker that keeps no record
    _age_heartbeat(raw, "h:dead", 10)

    rows = _claim_rows(short)

    assert [(rows[r.id][7], rows[r.id][8]) for r in (never, started, finished, stale)] == [
        (b"leased", 1), (b"started", 2), (b"finished", 0), (b"", 2)
    ]  # fmt: skip
    assert [raw.hget(T + r.id, "worker_losses") for r in (never, started, finished, stale)] == [b"1", b"2", b"0", b"2"]


def test_release_puts_a_task_back_where_it_was_as_if_never_started(short, raw):
    first, second = enqueue(short, echo, 1), enqueue(short, echo, 2)
    leased = short.acquire("default", count=2, worker="w")

    assert short.release([leased[0]]) == 1

    assert raw.zrange(Q + "ready", 0, -1) == [first.id.encode()]
    assert raw.zscore(Q + "ready", first.id) == float(raw.hget(T + first.id, "score"))
    assert raw.zrange(Q + "running", 0, -1) == [second.id.encode()]
    again = short.get_result(first.id)
    assert again.worker_ids == [] and again.errors == [] and again.started_at is None


def test_release_is_fenced_by_the_lease_token(short, raw):
    enqueue(short, echo)
    [leased] = short.acquire("default", worker="w")
    raw.hset(T + leased.id, "lease_token", "taken-over")
    assert short.release([leased]) == 0
    assert raw.zcard(Q + "running") == 1


def test_release_unanswered_hands_back_the_leases_of_a_call_by_its_token_base(short, raw):
    for i in range(3):
        enqueue(short, echo, i)
    short.acquire("default", count=2, worker="w", token_base="lost")
    [kept] = short.acquire("default", worker="w", token_base="answered")

    assert short.release_unanswered(["default"], ["lost"]) == 2

    assert raw.zcard(Q + "ready") == 2
    assert raw.zrange(Q + "running", 0, -1) == [kept.id.encode()]


# -- the broker's recovery ----------------------------------------------------------------


def test_recovery_returns_a_started_task_to_ready_with_the_lost_attempt_recorded(short, broker, raw):
    result = enqueue(short, echo, 1)
    short.acquire("default", worker="h:1")
    short.heartbeat("h:1", {"running": [result.id]})
    _age_heartbeat(raw, "h:1", 3)

    assert broker.run_once() == (0, 1)

    again = short.get_result(result.id)
    assert again.segment is Segment.READY
    assert again.worker_ids == ["h:1"]
    assert again.errors[-1].exception_class_path == "threadmill.exceptions.WorkerLost"
    assert "Worker h:1 sent no heartbeat for 3." in again.errors[-1].traceback
    # A late acknowledgement by the lost worker is refused.
    assert raw.hget(T + result.id, "lease_token") is None


def test_recovery_returns_a_task_the_last_heartbeat_saw_buffered_to_ready_with_no_attempt_recorded(short, broker, raw):
    running, buffered = enqueue(short, echo, 1), enqueue(short, echo, 2)
    short.acquire("default", count=2, worker="h:1")
    short.heartbeat("h:1", {"running": [running.id], "buffered": [buffered.id]})
    _age_heartbeat(raw, "h:1", 3)

    assert broker.run_once() == (0, 2)

    untouched = short.get_result(buffered.id)
    assert untouched.segment is Segment.READY
    assert untouched.worker_ids == [] and untouched.errors == []
    assert short.get_result(running.id).worker_ids == ["h:1"]


def test_recovery_fails_a_task_that_keeps_losing_its_worker(short, broker, raw):
    result = enqueue(short, echo, 1)
    for attempt in range(1, WORKER_LOSS_LIMIT + 1):
        worker = f"h:{attempt}"
        [leased] = short.acquire("default", worker=worker)
        if leased.worker_losses is not None:
            assert short.record_progress(leased, "started")  # as a worker starts a suspect
        short.heartbeat(worker, {"running": [result.id]})
        _age_heartbeat(raw, worker, 3)
        broker.run_once()

    lost = short.get_result(result.id)
    assert lost.segment is Segment.FAILED
    assert lost.worker_ids == ["h:1", "h:2", "h:3"]
    assert [e.exception_class_path for e in lost.errors] == ["threadmill.exceptions.WorkerLost"] * 3


def test_a_live_worker_keeps_its_leases(short, broker, raw):
    result = enqueue(short, echo, 1)
    short.acquire("default", worker="h:1")
    short.heartbeat("h:1", {"running": [result.id]})
    assert broker.run_once() == (0, 0)
    assert short.get_result(result.id).segment is Segment.RUNNING


def test_recovery_takes_back_the_leases_of_a_worker_with_no_heartbeat_once_they_are_worker_timeout_old(
    short, broker, raw
):
    lost, goodbye, _new = (enqueue(short, echo, i) for i in range(3))
    short.acquire("default", worker="h:1:lost")  # never beat: lost before its first heartbeat
    short.heartbeat("h:2:goodbye", {"type": "worker"})
    short.acquire("default", worker="h:2:goodbye")
    short.heartbeat("h:2:goodbye", None)  # said goodbye while a lease still named it
    [fresh] = short.acquire("default", worker="h:3:new")  # leased before its first heartbeat went out
    _age_lease(raw, lost.id, 2.5)  # worker_timeout is 2 s
    _age_lease(raw, goodbye.id, 2.5)

    assert broker.run_once() == (0, 2)

    for result, worker in ((lost, "h:1:lost"), (goodbye, "h:2:goodbye")):
        again = short.get_result(result.id)
        assert (again.status, again.worker_ids) == (TaskResultStatus.READY, [worker])
        assert again.errors[-1].exception_class_path == "threadmill.exceptions.WorkerLost"
        assert f"Worker {worker} sent no heartbeat for 2." in again.errors[-1].traceback
    kept = short.get_result(fresh.id)
    assert (kept.segment, kept.lease_worker, kept.lease_token) == (Segment.RUNNING, "h:3:new", fresh.lease_token)


def test_a_broker_that_just_reached_the_server_waits_before_trusting_heartbeats(short, raw):
    result = enqueue(short, echo, 1)
    short.acquire("default", worker="h:1")
    _age_heartbeat(raw, "h:1", 30)
    fresh = RedisBroker(short, ["default"])

    assert fresh.run_once() == (0, 0)
    assert short.get_result(result.id).segment is Segment.RUNNING
    # Once it has reached the server for worker_timeout + socket_timeout, it recovers.
    fresh._reachable_since -= 3
    assert fresh.run_once() == (0, 1)


def test_recovery_counts_a_task_leased_after_the_last_heartbeat_as_started(short, broker, raw):
    short.heartbeat("h:1", {"running": [], "buffered": []})
    result = enqueue(short, echo, 1)
    short.acquire("default", worker="h:1")
    _age_heartbeat(raw, "h:1", 3)

    broker.run_once()

    again = short.get_result(result.id)
    assert again.worker_ids == ["h:1"]
    assert again.errors[-1].exception_class_path == "threadmill.exceptions.WorkerLost"


def _lose(short, raw, worker: str, heartbeat: dict, record: tuple[str, ...] = ("started",)) -> list:
    """Lease every ready task to `worker`, record each suspect's progress as given, and lose the worker."""
    leased = short.acquire("default", count=10, worker=worker)
    for result in leased:
        for stage in record if result.worker_losses is not None else ():
            assert short.record_progress(result, stage)
    short.heartbeat(worker, heartbeat)
    _age_heartbeat(raw, worker, 3)
    return leased


def test_recovery_believes_what_a_suspect_s_lease_recorded_over_the_last_heartbeat(short, broker, raw):
    running, finished, waiting = _suspects(short, broker, raw, 3)
    leased = {r.id: r for r in short.acquire("default", count=3, worker="h:1")}
    short.record_progress(leased[running.id], "started")
    short.record_progress(leased[finished.id], "started")
    short.record_progress(leased[finished.id], "finished")
    # A heartbeat from before any of that, as stale as it may be.
    short.heartbeat("h:1", {"running": [waiting.id], "buffered": [running.id, finished.id]})
    _age_heartbeat(raw, "h:1", 3)

    assert broker.run_once() == (0, 3)

    blamed = short.get_result(running.id)
    assert blamed.segment is Segment.READY and blamed.worker_ids == ["h:1"]
    assert [e.exception_class_path for e in blamed.errors] == ["threadmill.exceptions.WorkerLost"]
    for unblamed in (finished, waiting):
        again = short.get_result(unblamed.id)
        assert again.segment is Segment.READY and again.worker_ids == [] and again.errors == []
    assert [raw.hget(T + r.id, "worker_losses") for r in (running, finished, waiting)] == [b"2", b"0", b"1"]


def test_recovery_fails_a_task_at_its_third_lost_worker_when_the_first_loss_looked_unstarted(short, broker, raw):
    [poison] = _suspects(short, broker, raw)  # its heartbeat saw it buffered: no attempt recorded
    for attempt in range(2, WORKER_LOSS_LIMIT + 1):
        _lose(short, raw, f"h:{attempt}", {"running": [], "buffered": [poison.id]})
        broker.run_once()

    failed = short.get_result(poison.id)
    assert failed.segment is Segment.FAILED
    assert failed.worker_ids == ["h:2", "h:3"]
    assert [e.exception_class_path for e in failed.errors] == ["threadmill.exceptions.WorkerLost"] * 2
    assert f"{WORKER_LOSS_LIMIT} lost workers in a row: it is likely what kills them." in failed.errors[-1].traceback


def test_recovery_never_fails_a_suspect_whose_lease_recorded_no_run_under_way(short, broker, raw):
    [innocent] = _suspects(short, broker, raw)
    _lose(short, raw, "h:2", {"running": [innocent.id]})  # it ran beside what killed its worker
    broker.run_once()
    assert raw.hget(T + innocent.id, "worker_losses") == b"2"

    for attempt, record in ((3, ()), (4, ("started", "finished")), (5, ())):
        _lose(short, raw, f"h:{attempt}", {"running": [innocent.id]}, record)
        broker.run_once()

    again = short.get_result(innocent.id)
    assert again.segment is Segment.READY
    assert [e.exception_class_path for e in again.errors] == ["threadmill.exceptions.WorkerLost"]
    assert raw.hget(T + innocent.id, "worker_losses") == b"0"


def test_recovery_of_a_suspect_leased_by_a_worker_that_keeps_no_record_falls_back_to_the_heartbeat(short, broker, raw):
    [suspect] = _suspects(short, broker, raw)

    def lose_to_an_older_release(worker: str, heartbeat: dict) -> None:
        short.acquire("default", worker=worker)
        raw.hdel(T + suspect.id, "progress")  # an older release's acquire writes no progress record
        short.heartbeat(worker, heartbeat)
        _age_heartbeat(raw, worker, 3)
        broker.run_once()

    lose_to_an_older_release("old:1", {"running": [], "buffered": [suspect.id]})
    assert short.get_result(suspect.id).errors == []  # not blamed on a heartbeat that saw it waiting
    for attempt in range(2, WORKER_LOSS_LIMIT + 2):
        lose_to_an_older_release(f"old:{attempt}", {"running": [suspect.id]})

    # Today's rule: three lost attempts recorded in a row, then failed, not lost forever.
    failed = short.get_result(suspect.id)
    assert failed.segment is Segment.FAILED
    assert [e.exception_class_path for e in failed.errors] == ["threadmill.exceptions.WorkerLost"] * 3
