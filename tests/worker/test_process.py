"""One WorkerProcess in this process, against the real server: what its fetcher and consumers decide."""

from __future__ import annotations

import time

import pytest
import redis

from tests import tasks
from tests.worker.conftest import wait_until
from threadmill.backends.broker import RedisBroker
from threadmill.backends.redis import RedisTaskBackend
from threadmill.backends.taskstats import FLUSH_INTERVAL_S
from threadmill.base import Segment
from threadmill.outcome import WORKER_LOSS_LIMIT
from threadmill.worker.config import WorkerConfig
from threadmill.worker.process import Phase, WorkerProcess
from threadmill.worker.telemetry import TelemetryPublisher


@pytest.fixture
def backend(redis_url) -> RedisTaskBackend:
    """The `default` alias with a lease shorter than the first task takes."""
    return RedisTaskBackend("default", {"REDIS_URL": redis_url, "OPTIONS": {"lease_ttl": 0.4}})


def _run_until_drained(backend: RedisTaskBackend, **config) -> WorkerProcess:
    process = WorkerProcess(backend, WorkerConfig(queues=("default",), exit_empty=True, **config), "h:1")
    process.start()
    assert process.finished.wait(30), "the process did not drain"
    return process


def test_a_buffered_task_whose_lease_ran_out_is_handed_back_not_run(backend):
    slow = backend.enqueue(tasks.sleep_for, [0.8], {})
    waiting = [backend.enqueue(tasks.echo, [i], {}) for i in range(2)]

    process = _run_until_drained(backend, threads=1, prefetch_count=3)

    assert process.phase is Phase.STOPPED and process.exit_code == 0
    assert process.done == 1
    assert backend.get_result(slow.id).segment is Segment.SUCCESSFUL
    for result in waiting:
        again = backend.get_result(result.id)
        assert again.segment is Segment.READY
        assert again.worker_ids == [] and again.errors == []


def test_a_drain_settles_every_task_and_leaves_nothing_held(redis_url):
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url})
    results = [backend.enqueue(tasks.echo, [i], {}) for i in range(50)]

    process = _run_until_drained(backend, threads=3, prefetch_count=6)

    assert process.done == 50 and not process.holds_leases
    assert backend.queue_stats()["default"][Segment.SUCCESSFUL] == len(results)


class StopsDuringAcquire(RedisTaskBackend):
    """The real backend; its first acquire that leases stops the process before the reply is handled.

    That is a SIGTERM arriving while an acquire's reply is on the wire, made deterministic.
    """

    process: WorkerProcess | None = None

    def acquire(self, *queue_names, **kwargs):
        results = super().acquire(*queue_names, **kwargs)
        if results and self.process is not None:
            self.process.stop()
            self.process = None
        return results


def test_leases_whose_reply_arrives_after_stop_go_back_to_ready_and_run_once_later(redis_url):
    backend = StopsDuringAcquire("default", {"REDIS_URL": redis_url})
    results = [backend.enqueue(tasks.echo, [i], {}) for i in range(6)]
    process = WorkerProcess(backend, WorkerConfig(queues=("default",), threads=2, prefetch_count=4), "h:1:a")
    backend.process = process

    process.start()
    assert process.finished.wait(30), "the stopped process did not finish"

    assert process.done == 0 and process.exit_code == 0
    assert not process.named_on_server
    for result in results:
        again = backend.get_result(result.id)
        assert again.segment is Segment.READY and again.worker_ids == [] and again.errors == []
    process = _run_until_drained(backend, threads=1)
    assert process.done == len(results)
    assert backend.queue_stats()["default"][Segment.SUCCESSFUL] == len(results)


def _blocked_clients(backend: RedisTaskBackend) -> int:
    return sum("b" in client["flags"] for client in backend.client.client_list())


def _poll(condition, deadline_s: float) -> float:
    """Poll `condition` until it holds; return the seconds it took, or fail at the deadline."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < deadline_s, f"not within {deadline_s} s"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.mark.parametrize("command", ["quiet", "stop"])
def test_a_process_told_to_stop_fetching_while_it_waits_passes_the_wake_token_on(redis_url, command):
    processes = []
    for name in ("h:1", "h:2"):
        process = WorkerProcess(RedisTaskBackend("default", {"REDIS_URL": redis_url}), WorkerConfig(), name)
        process.start()
        processes.append(process)
        # Blocked clients are served first come, first served: h:1 takes the next token.
        _poll(lambda n=len(processes): _blocked_clients(process.backend) == n, 5)  # noqa: B008, B023 - called at once
    told, other = processes
    try:
        getattr(told, command)()
        # The enqueue's token lands before the wake the signal handler sends from its thread.
        result = other.backend.enqueue(tasks.echo, [1], {})
        other.backend.wake_worker(told.name)

        took = _poll(lambda: other.backend.get_result(result.id).segment is Segment.SUCCESSFUL, 2)

        assert other.done == 1 and told.done == 0
        assert took < 1, took
    finally:
        for process in processes:
            process.stop()
            process.backend.wake_worker(process.name)
            assert process.finished.wait(10)


class LogsIdleCalls(RedisTaskBackend):
    """The real backend, logging each acquire and wake-list wait as it starts (and whether a wait was woken)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def acquire(self, *queue_names, **kwargs):
        self.calls.append("acquire")
        return super().acquire(*queue_names, **kwargs)

    def wait_for_tasks(self, queue_names, worker, timeout_s):
        self.calls.append("wait")
        woken = super().wait_for_tasks(queue_names, worker, timeout_s)
        self.calls.append("woken" if woken else "timed out")
        return woken


def _runs_counted(backend: RedisTaskBackend) -> int:
    return sum(stats.runs for stats in backend.task_stats(minutes=60))


def test_an_idle_process_sends_its_counts_from_the_wake_lists_and_waits_again_without_a_fetch(redis_url):
    backend = LogsIdleCalls("default", {"REDIS_URL": redis_url})
    process = WorkerProcess(backend, WorkerConfig(), "h:1")
    process.start()
    try:
        # The first counts go at once; the next ones wait for FLUSH_INTERVAL_S after them.
        backend.enqueue(tasks.echo, [1], {})
        _poll(lambda: _runs_counted(backend) == 1, 5)
        backend.enqueue(tasks.echo, [2], {})
        _poll(lambda: process.done == 2, 5)
        _poll(lambda: backend.calls[-1] == "wait", 5)
        since = len(backend.calls)

        # Sent within the flush interval and the server's timer tick, not at the 5 s idle deadline.
        took = _poll(lambda: _runs_counted(backend) == 2, 3)
        _poll(lambda: len(backend.calls) >= since + 2, 2)

        assert took < FLUSH_INTERVAL_S + 0.5, took
        # The wait ended at the counts' turn, and the process went back to the wake lists without an acquire.
        assert backend.calls[since - 1 : since + 2] == ["wait", "timed out", "wait"], backend.calls
    finally:
        process.stop()
        backend.wake_worker(process.name)
        assert process.finished.wait(10)


# -- suspects: tasks that were in a lost worker's lease -----------------------------------


@pytest.fixture
def recovering(redis_url) -> RedisTaskBackend:
    return RedisTaskBackend(
        "default", {"REDIS_URL": redis_url, "OPTIONS": {"worker_timeout": 2, "socket_timeout": 1, "lease_ttl": 30}}
    )


def _lose_its_worker(backend: RedisTaskBackend, task_id: str, times: int) -> None:
    """Lose the worker of the task (alone in its queue) `times` times, its run recorded as under way once a suspect."""
    broker = RedisBroker(backend, ["default"])
    broker._reachable_since = float("-inf")
    raw = redis.Redis.from_url(backend.redis_url)
    for attempt in range(times):
        worker = f"h:lost{attempt}"
        [leased] = backend.acquire("default", worker=worker)
        if leased.worker_losses is not None:
            backend.record_progress(leased, "started")
        backend.heartbeat(worker, {"buffered": [task_id]})
        seconds, micros = raw.time()
        raw.zadd(backend.keys.workers(), {worker: seconds + micros / 1e6 - 3})
        broker.run_once()
    assert backend.get_result(task_id).segment is Segment.READY


def test_a_suspect_records_its_start_and_finish_on_the_server(recovering):
    suspect = recovering.enqueue(tasks.echo, ["suspect"], {})
    _lose_its_worker(recovering, suspect.id, 1)
    key = recovering.keys.task(suspect.id)
    assert recovering.client.hget(key, "worker_losses") == b"1"

    process = _run_until_drained(recovering, threads=2)

    assert process.done == 1
    assert recovering.get_result(suspect.id).status.name == "SUCCESSFUL"
    progress, losses = recovering.client.hmget(key, "progress", "worker_losses")
    assert progress.decode().endswith(" finished") and losses is None


def test_a_suspect_whose_lease_was_taken_back_before_it_started_is_not_run(recovering):
    raw = recovering.client
    raw.hdel("test:runs", "suspect")
    suspect = recovering.enqueue(tasks.counted, ["suspect"], {})
    _lose_its_worker(recovering, suspect.id, 1)
    slow = recovering.enqueue(tasks.sleep_for.using(priority=10), [0.5], {})

    # The suspect waits in the buffer behind the slow task...
    process = WorkerProcess(recovering, WorkerConfig(queues=("default",), threads=1, prefetch_count=2), "h:1")
    process.start()
    wait_until(lambda: raw.hget(recovering.keys.task(suspect.id), "segment") == b"running", "the suspect is leased")
    # ... when the broker takes its lease back (as it would from a process it took for lost).
    raw.hset(recovering.keys.task(suspect.id), "lease_token", "taken-over")
    wait_until(lambda: process.done == 1 and not process.running, "the slow task is done")
    process.stop()
    assert process.finished.wait(10)

    assert raw.hget("test:runs", "suspect") is None
    assert recovering.get_result(slow.id).status.name == "SUCCESSFUL"
    assert raw.hget(recovering.keys.task(suspect.id), "lease_token") == b"taken-over"


def test_a_task_one_lost_worker_from_failing_runs_alone_in_its_process(recovering):
    alone = recovering.enqueue(tasks.spell, ["alone", 0.3], {})
    _lose_its_worker(recovering, alone.id, WORKER_LOSS_LIMIT - 1)
    ahead = [recovering.enqueue(tasks.spell.using(priority=10), [f"ahead-{i}", 0.3], {}) for i in range(2)]
    behind = [recovering.enqueue(tasks.spell.using(priority=-10), [f"behind-{i}", 0.3], {}) for i in range(2)]
    recovering.client.delete("test:spells")

    process = _run_until_drained(recovering, threads=3, prefetch_count=6)

    assert process.done == 5
    assert {recovering.get_result(r.id).status.name for r in [alone, *ahead, *behind]} == {"SUCCESSFUL"}
    spells = {k.decode(): tuple(map(float, v.split())) for k, v in recovering.client.hgetall("test:spells").items()}
    start, end = spells.pop("alone")
    overlapping = [key for key, (s, e) in spells.items() if s < end and e > start]
    assert overlapping == [], f"ran beside the task that runs alone: {overlapping}"
    # The others did run side by side: three threads.
    assert spells["ahead-0"][0] < spells["ahead-1"][1] and spells["ahead-1"][0] < spells["ahead-0"][1]


def test_a_process_that_ends_at_once_says_goodbye_after_its_first_heartbeat_not_before(backend):
    # Nothing to do: the process ends within milliseconds, while its first heartbeat may still be on
    # the wire. A goodbye sent before that beat lands would leave the name in the workers set.
    for round_ in range(30):
        process = WorkerProcess(backend, WorkerConfig(queues=("default",), exit_empty=True), f"h:1:r{round_}")
        telemetry = TelemetryPublisher(process)
        process.start()
        telemetry.start()
        assert process.finished.wait(30), "the process did not find its queue empty"
        telemetry.goodbye()
        assert backend.worker_heartbeats() == {}, f"round {round_}: a heartbeat landed after the goodbye"
