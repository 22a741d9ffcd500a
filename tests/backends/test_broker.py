"""The mover and the reaper, run by RedisBroker."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.tasks import TaskResultStatus

from tests.backends.conftest import enqueue, same_server
from tests.tasks import echo, explode, flaky
from threadmill.backends import broker as broker_package
from threadmill.backends.broker import DUTIES, BrokerPass, Duty, RedisBroker
from threadmill.backends.broker import trimmer as broker_module
from threadmill.backends.broker.full_trimmer import FULL_CHECK_INTERVAL_S, FullTrimmer
from threadmill.backends.broker.mover import Mover
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment

RUNNING = "threadmill:{default}:default:running"


def _expire_leases(raw) -> None:
    for task_id in raw.zrange(RUNNING, 0, -1):
        raw.zadd(RUNNING, {task_id: 1})


def test_the_mover_promotes_due_deferred_tasks_in_priority_order(backend, raw):
    due = enqueue(backend, echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), 1)
    later = enqueue(backend, echo.using(run_after=datetime.now(UTC) + timedelta(hours=1)), 2)
    assert RedisBroker(backend, ["default"]).move("default") == 1
    assert [r.id for r in backend.peek("default", segment="ready")] == [due.id]
    assert [r.id for r in backend.peek("default", segment="deferred")] == [later.id]


def test_the_mover_works_through_more_than_one_batch(backend):
    past = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(17):  # batch_size is 7 in the contract fixture
        enqueue(backend, echo.using(run_after=past), i)
    assert RedisBroker(backend, ["default"]).move("default") == 17
    assert backend.queue_stats()["default"][Segment.READY] == 17


def test_the_reaper_fails_an_expired_lease_with_acknowledgement_timeout(backend, raw):
    result = enqueue(backend, explode)
    backend.acquire("default", worker="host:1")
    _expire_leases(raw)
    assert RedisBroker(backend, ["default"]).reap("default") == 1
    failed = backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class_path == "threadmill.exceptions.AcknowledgementTimeout"
    assert "host:1" in failed.errors[-1].traceback
    assert failed.worker_ids == ["host:1"]


def test_the_reaper_retries_per_the_tasks_policy(backend, raw):
    result = enqueue(backend, flaky)
    backend.acquire("default", worker="host:1")
    _expire_leases(raw)
    RedisBroker(backend, ["default"]).reap("default")
    assert [r.id for r in backend.peek("default", segment="deferred")] == [result.id]
    stored = backend.get_result(result.id)
    assert stored.status == TaskResultStatus.READY
    assert stored.worker_ids == ["host:1"]
    assert len(stored.errors) == 1


def test_the_reaper_leaves_live_leases_alone(backend):
    enqueue(backend, echo, 1)
    backend.acquire("default", worker="w")
    assert RedisBroker(backend, ["default"]).reap("default") == 0
    assert backend.queue_stats()["default"][Segment.RUNNING] == 1


def test_a_late_acknowledgement_after_the_reaper_is_refused(backend, raw):
    from tests.backends.conftest import finish

    enqueue(backend, explode)
    [leased] = backend.acquire("default", worker="slow")
    _expire_leases(raw)
    RedisBroker(backend, ["default"]).reap("default")
    assert not finish(backend, leased, "too late")
    assert backend.queue_stats()["default"][Segment.FAILED] == 1


def test_several_brokers_at_once_never_handle_one_task_twice(backend, raw):
    ids = {enqueue(backend, explode).id for _ in range(40)}
    while backend.acquire("default", count=10, worker="w"):
        pass
    _expire_leases(raw)
    reaped = [0, 0, 0]

    def reap(slot):
        other = RedisTaskBackend("default", same_server(backend, OPTIONS={"batch_size": 3}))
        reaped[slot] = RedisBroker(other, ["default"]).reap("default")

    threads = [threading.Thread(target=reap, args=(slot,)) for slot in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(reaped) == 40
    failed = backend.peek("default", segment="failed", count=100)
    assert {r.id for r in failed} == ids
    assert all(len(r.errors) == 1 for r in failed)


def test_run_stops_when_its_event_is_set(backend):
    stop = threading.Event()
    enqueue(backend, echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), 1)
    thread = threading.Thread(target=RedisBroker(backend, ["default"]).run, args=(stop,))
    thread.start()
    deadline = datetime.now(UTC) + timedelta(seconds=5)
    while backend.queue_stats()["default"][Segment.READY] == 0 and datetime.now(UTC) < deadline:
        stop.wait(0.01)
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert backend.queue_stats()["default"][Segment.READY] == 1


def test_a_pass_trims_finished_ids_older_than_the_result_ttl_on_an_idle_queue(backend, raw):
    now = float(raw.time()[0])
    raw.zadd("threadmill:{default}:default:successful", {"expired": 1.0, "recent": now})
    raw.zadd("threadmill:{default}:default:failed", {"expired-too": now - backend.config.result_ttl - 5})
    RedisBroker(backend, ["default"]).run_once()
    assert raw.zrange("threadmill:{default}:default:successful", 0, -1) == [b"recent"]
    assert raw.zcard("threadmill:{default}:default:failed") == 0
    assert backend.queue_stats()["default"][Segment.SUCCESSFUL] == 1


def test_trimming_works_through_more_than_one_batch(backend, raw, monkeypatch):
    monkeypatch.setattr(broker_module, "TRIM_BATCH_SIZE", 3)
    raw.zadd("threadmill:{default}:default:failed", {f"old-{i}": i + 1.0 for i in range(10)})
    raw.zadd("threadmill:{default}:default:successful", {"old": 1.0})
    assert RedisBroker(backend, ["default"]).trim("default") == 11
    assert raw.zcard("threadmill:{default}:default:failed") == 0


TALLY = "threadmill:{default}:tally"


class Tally(Duty):
    """A duty that counts its runs on the server: one INCR a pass, on partition 0."""

    name = "tally"

    def run_once(self, pass_: BrokerPass) -> int:
        return pass_.attempt(0, self.backend.client.incr, f"{TALLY}:{self.name}") or 0


class HourlyTally(Tally):
    name = "hourly"

    def interval(self) -> float:
        return 3600.0


def test_a_duty_added_to_the_registry_runs_in_every_pass(backend, raw, monkeypatch):
    monkeypatch.setattr(broker_package, "DUTIES", (*DUTIES, Tally))
    enqueue(backend, echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), 1)
    broker = RedisBroker(backend, ["default"])
    assert broker.run_once() == (1, 0)  # the registry's own duties still run beside it
    broker.run_once()
    assert raw.get(f"{TALLY}:tally") == b"2"


def test_a_duty_left_out_of_the_registry_does_not_run(backend, monkeypatch):
    monkeypatch.setattr(broker_package, "DUTIES", tuple(duty for duty in DUTIES if duty is not Mover))
    enqueue(backend, echo.using(run_after=datetime.now(UTC) - timedelta(seconds=1)), 1)
    assert RedisBroker(backend, ["default"]).run_once() == (0, 0)
    assert backend.queue_stats()["default"][Segment.DEFERRED] == 1


def test_a_due_only_pass_leaves_out_a_duty_whose_interval_has_not_passed(backend, raw, monkeypatch):
    monkeypatch.setattr(broker_package, "DUTIES", (*DUTIES, Tally, HourlyTally))
    broker = RedisBroker(backend, ["default"])
    for _ in range(3):
        broker.run_once(due_only=True)
        for duty in broker.duties:  # every duty but the hourly one falls due at once
            broker._due_at[duty.name] -= backend.config.broker_interval
    assert (raw.get(f"{TALLY}:tally"), raw.get(f"{TALLY}:hourly")) == (b"3", b"1")
    broker.run_once()  # a full pass runs every duty
    assert raw.get(f"{TALLY}:hourly") == b"2"


@pytest.mark.single_partition
def test_the_full_trimmer_reads_the_memory_every_pass_until_it_finds_the_server_far_from_full(backend, raw):
    # The session's server has no maxmemory: after its first read the duty waits FULL_CHECK_INTERVAL_S
    # (an idle worker's cost: one INFO and one ZREMRANGEBYSCORE each time), and drops old tombstones.
    broker = RedisBroker(backend, ["default"])
    trimmer = next(duty for duty in broker.duties if isinstance(duty, FullTrimmer))
    assert trimmer.interval() == backend.config.broker_interval
    raw.zadd("threadmill:{default}:trimmed", {"old": 1.0, "fresh": time.time()})
    broker.run_once()
    if backend.cluster:  # one INFO would not say which node is full: the duty does nothing there
        assert raw.zcard("threadmill:{default}:trimmed") == 2
        return
    assert trimmer.interval() == FULL_CHECK_INTERVAL_S
    assert raw.zrange("threadmill:{default}:trimmed", 0, -1) == [b"fresh"]
