"""The consumers of a worker process: threads that take buffered tasks in lease order and run them.

A consumer never touches the server, so a fast task costs a fraction of a round trip, except
for a suspect (`suspects.py`) and a bounded run whose lease must be extended first
(`limits.py`). It never starts a task whose lease may have run out while it waited in the
buffer (by this process's monotonic clock), nor one the heartbeat no longer vouches for
(`trust.py`): that task is handed back instead. A task's BaseException (`sys.exit()`,
KeyboardInterrupt) is its outcome, like any failure: the consumer thread lives on.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from ..base import ThreadmillTaskResult, time_limit_s
from ..outcome import error_of, mark_failed, runs_alone
from ..progress import running
from .executor import Executor, Outcome
from .host import ProcessHost
from .state import Buffered, Phase

logger = logging.getLogger("threadmill.worker")


class Consumers(ProcessHost):
    """Mixed into `WorkerProcess`: the consumer threads' loop, from a buffered task to its outcome.

    Uses the process's buffer, `running`, `outcomes`, `unstarted`, its lock and both conditions.
    """

    def _consume(self, executor: Executor) -> None:
        lock, buffer, outcome, result, ran_s = self._lock, self.buffer, None, None, 0.0
        clock, monotonic = time.perf_counter, time.monotonic
        executor.thread_id, running.executor = threading.get_ident(), executor
        try:
            while True:
                with lock:
                    if outcome is not None:
                        self._finish(outcome, ran_s)
                    outcome = result = entry = None
                    while entry is None:
                        if not buffer or self._held_back():
                            if not self._wait_for_tasks():
                                return
                            executor.idle = True
                        entry = self._take_runnable(buffer.popleft())
                    result = entry.result
                    self.running[result.lease_token] = result
                    if runs_alone(result):
                        self._alone = result.lease_token
                    # Edge-triggered: the fetcher re-checks before it waits, and a wake-up
                    # per task cost more CPU than the echo task itself.
                    if self._wake_at_refill and self.size - len(buffer) == self.refill_at:
                        self._has_work.notify()
                if result.worker_losses is not None and not self._record_start(result):
                    result = None
                    continue
                limit_s = time_limit_s(result.task, self.default_limit_s)
                if limit_s is not None and not self._cover_lease(result, entry.expires, limit_s):
                    result = None
                    continue
                executor.started_at = started = clock()
                began = monotonic() + entry.clock_offset
                outcome = self._run(executor, result, limit_s)
                ran_s = clock() - started
                object.__setattr__(result, "ran", (began, began + ran_s))
                executor.started_at = None
                if result.worker_losses is not None:
                    self._record_finish(result)
        finally:
            executor.started_at = None
            with lock:
                self.consumers_alive -= 1
                self._has_tasks.notify_all()  # It may have run alone.
                if outcome is not None:
                    self._finish(outcome, ran_s)
                elif result is not None and self.running.pop(result.lease_token, None) is not None:
                    # Not reached by task code (its BaseExceptions are outcomes): the broker recovers it.
                    logger.error("Task %s stopped its consumer thread; its lease is left to the broker.", result.id)
                    self.left_leases = True
                self._has_work.notify()
            executor.close()

    def _take_runnable(self, entry: Buffered) -> Buffered | None:
        """Return `entry` when its task may run, or None when its lease may be lost (it is handed back)."""
        now = time.monotonic()
        if entry.epoch != self.trust_epoch or now - self.heartbeat_confirmed_at > self.trust_s:
            # The broker may have recovered it while this process was silent: never start it on trust.
            self._distrust_buffer(entry, now)
            return None
        if now < entry.expires:
            return entry
        logger.warning("Task %s waited in the buffer past its lease; it is handed back, not run.", entry.result.id)
        self.unstarted.append(entry.result)
        self._has_work.notify()
        return None

    def _wait_for_tasks(self) -> bool:
        """Wait, holding the lock, until a buffered task may start; False once none will come."""
        while not self.buffer or self._held_back():
            if not self.buffer and self.phase not in (Phase.FETCHING, Phase.QUIET):
                return False
            self._has_work.notify()
            self._has_tasks.wait()
        return True

    def _drop_unstarted(self, result: ThreadmillTaskResult, unstarted: list[ThreadmillTaskResult]) -> None:
        with self._lock:
            self.running.pop(result.lease_token, None)
            self.unstarted += unstarted
            self._has_work.notify()
            self._has_tasks.notify_all()

    def _finish(self, outcome: Outcome, ran_s: float) -> None:
        if self.running.pop(outcome.result.lease_token, None) is None:
            return  # handed back at the shutdown deadline; the process is exiting
        if self.aborted:
            self.aborted.pop(outcome.result.lease_token, None)
        self.prefetch.task_ran(ran_s)
        if outcome.result.lease_token == self._alone:
            self._has_tasks.notify_all()
        self.done += 1
        if not self.outcomes:
            self._outcomes_since = time.monotonic()
        self.outcomes.append(outcome)
        if len(self.outcomes) >= self.ack_batch or self.phase is Phase.STOPPING:
            self._has_work.notify()

    def _run(self, executor: Executor, result: ThreadmillTaskResult, limit_s: float | None) -> Outcome:
        running.task = (self.reports, result)
        try:
            return executor.run(result, limit_s)
        except BaseException as e:
            # Only a failing signal receiver gets here; the task itself is already settled.
            logger.exception("Running task %s failed outside the task code.", result.id)
            mark_failed(result, error_of(e), datetime.now(UTC))
            return Outcome(result, None, None)
        finally:
            running.task = None
