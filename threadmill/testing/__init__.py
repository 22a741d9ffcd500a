"""Run a Threadmill alias's tasks for real in a test: `drain()` runs every ready task, then returns.

`drain` is a worker process's own machinery (`threadmill.worker.process.WorkerProcess`, its
heartbeat and its `--exit-empty` phase) run inside the calling process, on threads: the
fetcher leases tasks, one consumer thread runs them, the fetcher acknowledges them or requeues
the ones to retry. Between rounds the mover promotes deferred tasks, so a retry whose delay
ends before the timeout runs in the same call. Nothing here is imported by the task path: a
project pays for it only in the tests that import it.

Invariant: when `drain` returns or raises, no lease it took is left on the server. At the
timeout the tasks still running are handed back to ready as interrupted attempts (what the
worker does at its shutdown deadline); their threads cannot be killed and run on, unrecorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResult, TaskResultStatus, task_backends
from django.tasks.signals import task_finished

from ..backends.broker import RedisBroker
from ..backends.redis import RedisTaskBackend
from ..exceptions import DrainTimeout
from ..identity import WorkerName, new_incarnation
from ..worker.config import WorkerConfig
from ..worker.process import WorkerProcess
from ..worker.telemetry import TelemetryPublisher

__all__ = ["DEFAULT_DRAIN_TIMEOUT_S", "Drained", "drain"]

#: Longest a `drain` runs before it gives up on the tasks still running, seconds.
DEFAULT_DRAIN_TIMEOUT_S = 30.0
#: Longest the worker takes to hand back what it holds once its timeout passed, seconds.
HAND_BACK_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Drained:
    """What a `drain` ran: each task as stored once it returned, and how many attempts that took."""

    #: Each task that ran, in the order its first attempt finished, as `get_result` returns it now.
    results: tuple[TaskResult, ...]
    #: Attempts run: a task retried twice counts three.
    attempts: int

    @property
    def successful(self) -> tuple[TaskResult, ...]:
        """The tasks that ended SUCCESSFUL."""
        return tuple(r for r in self.results if r.status == TaskResultStatus.SUCCESSFUL)

    @property
    def failed(self) -> tuple[TaskResult, ...]:
        """The tasks that ended FAILED."""
        return tuple(r for r in self.results if r.status == TaskResultStatus.FAILED)


def drain(
    alias: str = "default", queues: Iterable[str] | None = None, timeout: float = DEFAULT_DRAIN_TIMEOUT_S
) -> Drained:
    """Run every ready task of the alias's queues in this process until none is left, and return what ran.

    A deferred task (a retry, a `run_after`) that falls due within `timeout` is waited for and
    run too; one due later stays deferred. Ready tasks a limit holds back are waited for, as
    `--exit-empty` does.

    Args:
        alias: the TASKS alias, configured with Threadmill's backend.
        queues: the queues to run (default: every queue of the alias); an unknown one is a ValueError.
        timeout: seconds from the call after which tasks still running are handed back to ready.

    Raises:
        DrainTimeout: a task still ran at `timeout` (its attempt is recorded as interrupted), or a
            concurrency or rate limit still held ready tasks back.
    """
    backend = _threadmill_backend(alias)
    names = _known_queues(backend, queues)
    run = _Run(backend, WorkerConfig(backend=alias, queues=names, exit_empty=True, shutdown_timeout=0.0))
    task_finished.connect(run.finished, weak=False)
    try:
        attempts = run.until_empty(time.monotonic() + timeout, timeout)
    finally:
        task_finished.disconnect(run.finished)
    return Drained(tuple(backend.get_result(task_id) for task_id in dict.fromkeys(run.task_ids)), attempts)


def _threadmill_backend(alias: str) -> RedisTaskBackend:
    backend = task_backends[alias]
    if not isinstance(backend, RedisTaskBackend):
        raise ImproperlyConfigured(
            f"drain() runs the tasks of a Threadmill backend; TASKS[{alias!r}] is {type(backend).__name__}."
        )
    return backend


def _known_queues(backend: RedisTaskBackend, queues: Iterable[str] | None) -> tuple[str, ...]:
    """Return the queues to drain (every queue of the backend when None), or ValueError naming the unknown ones."""
    known = backend.queue_names()
    if queues is None:
        return tuple(known)
    names = tuple(dict.fromkeys(queues))
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"Unknown queue(s) {', '.join(unknown)}; backend {backend.alias!r} has {', '.join(known)}.")
    return names


class _Run:
    """One `drain`: worker rounds under one worker name until nothing is ready and nothing falls due in time."""

    def __init__(self, backend: RedisTaskBackend, config: WorkerConfig) -> None:
        self.backend = backend
        self.config = config
        self.name = str(WorkerName.for_process(new_incarnation()))
        self.broker = RedisBroker(backend, list(config.queues))
        #: Ids of the tasks whose attempts this run finished, in order (a retried task more than once).
        self.task_ids: list[str] = []
        self._lock = threading.Lock()

    def finished(self, sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        """Note a task's attempt finished by this run's worker (Django's `task_finished`, on its thread)."""
        if task_result.worker_ids[-1:] == [self.name]:
            with self._lock:
                self.task_ids.append(task_result.id)

    def until_empty(self, deadline: float, timeout: float) -> int:
        """Run rounds until no task is ready and no deferred one falls due by `deadline`; return the attempts."""
        attempts = 0
        while True:
            self.broker.move_all()
            ran = self._round(deadline, timeout)
            attempts += ran
            if ran:
                continue
            # Nothing ran, so nothing was deferred since the mover's run: its next due moment stands.
            due_at = self.broker.next_due_at
            if due_at is None or due_at > deadline:
                return attempts
            time.sleep(max(0.0, due_at - time.monotonic()))

    def _round(self, deadline: float, timeout: float) -> int:
        """Run one worker process until `--exit-empty` finds nothing ready; return the attempts it ran."""
        process = WorkerProcess(self.backend, self.config, self.name)
        telemetry = TelemetryPublisher(process)
        process.start()
        telemetry.start()
        try:
            if not process.finished.wait(max(0.0, deadline - time.monotonic())):
                self._give_up(process, timeout)
        finally:
            telemetry.goodbye()  # after the heartbeat thread's last beat (TelemetryPublisher.goodbye)
        return process.done

    def _give_up(self, process: WorkerProcess, timeout: float) -> None:
        """Stop `process` at once, its running tasks handed back to ready, and raise DrainTimeout naming them."""
        running = sorted(f"{r.id} ({r.task.module_path})" for r in list(process.running.values()))
        process.stop(because=f"interrupted this attempt when drain() timed out after {timeout:g} s")
        self.backend.wake_worker(process.name)
        handed_back = process.finished.wait(HAND_BACK_TIMEOUT_S)
        if running:
            what = f"{'task' if len(running) == 1 else 'tasks'} {', '.join(running)} still ran"
        else:
            what = "no task was running, the ready ones held back by a limit (or the server did not answer)"
        after = "went back to ready" if handed_back else "are left to the broker (the server did not answer)"
        raise DrainTimeout(f"drain() timed out after {timeout:g} s: {what}; the tasks it held {after}.")
