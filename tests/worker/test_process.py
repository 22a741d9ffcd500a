"""One WorkerProcess in this process, against the real server: what its fetcher and consumers decide."""

from __future__ import annotations

import time

import pytest

from tests import tasks
from threadmill.backends.base import Segment
from threadmill.backends.redis import RedisTaskBackend
from threadmill.worker.config import WorkerConfig
from threadmill.worker.process import Phase, WorkerProcess


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
        _poll(lambda n=len(processes): _blocked_clients(process.backend) == n, 5)
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
