"""One worker process: a fetcher thread, consumer threads and the bounded buffer between them.

The fetcher is the only thread that talks to the broker. Once half the buffer is free it
leases as many tasks as there are free slots, in one acquire. It acknowledges finished
tasks in one acknowledge_many call, apart from fetching: once `ACK_BATCH` are waiting,
`ACK_DELAY_S` after the first of them finished, or at once when the consumers have nothing
left to run. Consumers take tasks in lease order and never touch the broker, so a fast
task costs a fraction of a round trip.

Invariants: the fetcher never leases past the `--max-tasks` budget, so every leased task
runs; every finished task is acknowledged or requeued before the process exits, unless
the process is killed or stopped at once (the reaper then recovers the leases).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..backends.base import ThreadmillTaskResult
from ..outcome import error_of, mark_failed
from .config import EXIT_FAILED, EXIT_RECYCLED, WorkerConfig
from .executor import Executor, Outcome

if TYPE_CHECKING:
    from ..backends.redis import RedisTaskBackend

logger = logging.getLogger("threadmill.worker")

#: Longest time a finished task waits in the process for its acknowledgement, seconds.
ACK_DELAY_S = 0.02
#: Finished tasks that trigger an acknowledgement before `ACK_DELAY_S` is up. Acknowledging
#: is decoupled from fetching: one call costs about as much CPU as three echo tasks, and
#: batching it at 100 instead of at each 4-task fetch saved a third of the CPU per task.
ACK_BATCH = 100


class WorkerProcess:
    """Leases tasks into a buffer, runs them on consumer threads and acknowledges them."""

    def __init__(self, backend: RedisTaskBackend, config: WorkerConfig, name: str) -> None:
        self.backend = backend
        self.config = config
        self.name = name
        self.size = config.buffer_size
        #: Free slots that trigger a fetch. Refilling at half empty, not at every free slot,
        #: keeps batches large: a fetch costs about as much CPU as running four echo tasks.
        self.refill_at = max(1, self.size // 2)
        self.ack_batch = max(ACK_BATCH, self.size)
        #: A lone consumer holds the GIL until it runs dry, so the fetcher could not refill
        #: early anyway: its idle wake-up is the one per batch. An extra wake-up at the refill
        #: mark cost about a fifth more CPU per echo task. Several consumers need the early refill.
        self._wake_at_refill = config.threads > 1
        self.budget = (
            None if config.max_tasks is None else config.max_tasks + random.randint(0, config.max_tasks_jitter)
        )
        self.buffer: deque[ThreadmillTaskResult] = deque()
        self.outcomes: list[Outcome] = []
        self.busy = 0
        self.done = 0
        self.consumers_alive = 0
        self.fetching = True
        self.recycled = False
        self.failed = False
        self.finished = threading.Event()
        self._acquiring = False
        self._outcomes_since = 0.0
        self._next_fetch_at = 0.0
        self._pause = backend.options.poll_interval
        self._lock = threading.Lock()
        self._has_tasks = threading.Condition(self._lock)
        self._has_work = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the consumer threads and the fetcher thread."""
        sender = type(self.backend)
        self.consumers_alive = self.config.threads
        for index in range(1, self.config.threads + 1):
            thread = threading.Thread(
                target=self._consume, args=(Executor(sender),), name=f"consumer-{index}", daemon=True
            )
            self._threads.append(thread)
        self._threads.append(threading.Thread(target=self._fetch, name="fetcher", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop fetching; the buffered and running tasks still finish and are acknowledged."""
        with self._lock:
            self.fetching = False
            self._has_work.notify()
            self._has_tasks.notify_all()

    @property
    def exit_code(self) -> int:
        """The process's exit code once `finished` is set."""
        return EXIT_FAILED if self.failed else EXIT_RECYCLED if self.recycled else 0

    @property
    def _closed(self) -> bool:
        return not self.fetching and not self._acquiring

    # -- the fetcher ------------------------------------------------------------------

    def _fetch(self) -> None:
        try:
            while (job := self._next_job()) is not None:
                outcomes, count = job
                if outcomes and not self._settle(outcomes):
                    return
                if count:
                    self._lease(count)
        except Exception:
            logger.exception("The fetcher thread failed; this worker process stops.")
            self.failed = True
        finally:
            self._abandon()
            self.finished.set()

    def _next_job(self) -> tuple[list[Outcome], int] | None:
        """Wait until there is something to acknowledge or fetch; None once everything is settled."""
        with self._lock:
            while True:
                now = time.monotonic()
                count = self._wanted(now) if self.consumers_alive else 0
                idle = not self.busy and not self.buffer
                outcomes = self.outcomes
                if outcomes and (
                    (idle and not count) or len(outcomes) >= self.ack_batch or now - self._outcomes_since >= ACK_DELAY_S
                ):
                    self.outcomes = []
                    return outcomes, count
                if count:
                    return [], count
                if idle and self._closed:
                    return None
                if not self.consumers_alive:
                    self._consumers_gone()
                    return None
                self._has_work.wait(self._wait_time(now))

    def _wanted(self, now: float) -> int:
        if not self.fetching or now < self._next_fetch_at:
            return 0
        free = self.size - len(self.buffer)
        if free < self.refill_at:
            return 0
        count = free if self.budget is None else min(free, self.budget)
        self._acquiring = count > 0
        return count

    def _wait_time(self, now: float) -> float | None:
        if self.outcomes:
            return max(0.0, self._outcomes_since + ACK_DELAY_S - now)
        if self.busy or self.buffer:
            return ACK_DELAY_S
        if self.fetching:
            return max(0.0, self._next_fetch_at - now)
        return None

    def _lease(self, count: int) -> None:
        try:
            results = self.backend.acquire(*self.config.queues, count=count, worker=self.name)
        except Exception:
            logger.exception(
                "Fetching tasks from queues %s failed; this worker process stops.", ", ".join(self.config.queues)
            )
            results, self.failed = [], True
        with self._lock:
            self._acquiring = False
            if self.failed:
                self.fetching = False
            elif results:
                self._pause = self.backend.options.poll_interval
                self.buffer.extend(results)
                if self.budget is not None:
                    self.budget -= len(results)
                    if self.budget <= 0:
                        self.fetching, self.recycled = False, True
            elif self.config.exit_empty:
                self.fetching = False
            else:
                self._next_fetch_at = time.monotonic() + self._pause
                self._pause = min(2 * self._pause, self.backend.options.poll_max_interval)
            if self.fetching:
                self._has_tasks.notify(len(results))
            else:
                self._has_tasks.notify_all()

    def _settle(self, outcomes: list[Outcome]) -> bool:
        """Acknowledge or requeue finished tasks; False when the broker failed (leases go to the reaper)."""
        try:
            acknowledged = [(o.result, o.return_value) for o in outcomes if o.retry_after is None]
            if acknowledged:
                self.backend.acknowledge_many(acknowledged)
            for outcome in outcomes:
                if outcome.retry_after is not None:
                    self.backend.requeue(outcome.result, run_after=outcome.retry_after)
        except Exception:
            logger.exception(
                "Acknowledging %d finished tasks failed; the reaper will recover their leases.", len(outcomes)
            )
            self.failed = True
            return False
        return True

    def _consumers_gone(self) -> None:
        logger.error("Every consumer thread of this worker process died; it stops and is replaced.")
        self.failed = True

    def _abandon(self) -> None:
        """Stop for good: nothing more is fetched, and consumers exit once the buffer is empty."""
        with self._lock:
            self.fetching = self._acquiring = False
            if self.failed and self.buffer:
                logger.warning("%d leased tasks were not run; the reaper will recover them.", len(self.buffer))
                self.buffer.clear()
            self._has_tasks.notify_all()

    # -- the consumers ----------------------------------------------------------------

    def _consume(self, executor: Executor) -> None:
        lock, buffer, outcome, running = self._lock, self.buffer, None, False
        try:
            while True:
                with lock:
                    if outcome is not None:
                        self._finish(outcome)
                        outcome, running = None, False
                    if not buffer:
                        if not self._wait_for_tasks():
                            return
                        executor.idle = True
                    result = buffer.popleft()
                    self.busy += 1
                    running = True
                    # Edge-triggered: the fetcher re-checks before it waits, and a wake-up
                    # per task cost more CPU than the echo task itself.
                    if self._wake_at_refill and self.size - len(buffer) == self.refill_at:
                        self._has_work.notify()
                outcome = self._run(executor, result)
        finally:
            with lock:
                self.consumers_alive -= 1
                if outcome is not None:
                    self._finish(outcome)
                elif running:
                    # Task code raised SystemExit or KeyboardInterrupt: its lease goes to the reaper.
                    logger.error("Task %s stopped its consumer thread; the reaper will recover its lease.", result.id)
                    self.busy -= 1
                self._has_work.notify()
            executor.close()

    def _wait_for_tasks(self) -> bool:
        """Wait, holding the lock, until a task is buffered; False once none will come."""
        while not self.buffer:
            if self._closed:
                return False
            self._has_work.notify()
            self._has_tasks.wait()
        return True

    def _finish(self, outcome: Outcome) -> None:
        self.busy -= 1
        self.done += 1
        if not self.outcomes:
            self._outcomes_since = time.monotonic()
        self.outcomes.append(outcome)
        if len(self.outcomes) >= self.ack_batch:
            self._has_work.notify()

    def _run(self, executor: Executor, result: ThreadmillTaskResult) -> Outcome:
        try:
            return executor.run(result)
        except Exception as e:
            # Only a failing signal receiver gets here; the task itself is already settled.
            logger.exception("Running task %s failed outside the task code.", result.id)
            mark_failed(result, error_of(e), datetime.now(UTC))
            return Outcome(result, None, None)
