"""Abort polling: how an abort request stored with a running task reaches its run.

While a task has run `ABORT_CHECK_INTERVAL_S` or more, the fetcher reads, at most that often
and in one read-only call, whether an abort was requested for any such run, and hands a request
to the run's executor (`Executor.request_abort`); the watchdog raises `TaskCancelled` in it
`abort_grace` later. A drain of short tasks never makes the call. A run an abort reached is
kept in the process's `aborted` (by lease token, with the message its TaskCancelled carries):
still going at the shutdown deadline, it is recorded FAILED with `TaskCancelled`, not handed back.
A task leased that long ago and still waiting in the buffer is looked for in the same call: an
abort request found for it takes it out of the buffer, and it is recorded FAILED with
`TaskCancelled` without starting.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from ..base import ThreadmillTaskResult
from ..outcome import cancelled_error, mark_failed
from .executor import Outcome
from .host import ProcessHost

logger = logging.getLogger("threadmill.worker")

#: Shortest run, and pause between two looks, after which the fetcher looks for abort requests, seconds:
#: a request reaches a run within about twice this, and tasks shorter than it never cost a call.
ABORT_CHECK_INTERVAL_S = 0.5


class AbortPolling(ProcessHost):
    """Mixed into `WorkerProcess`: the fetcher's look for abort requests and their delivery.

    Uses the process's `backend`, `_executors`, `running`, `aborted` and its lock.
    """

    def _abort_candidates(self) -> list[ThreadmillTaskResult]:
        """The runs going on, and the buffered tasks leased, `ABORT_CHECK_INTERVAL_S` or more ago (the lock held).

        A run an abort already reached is left out.
        """
        since = time.perf_counter() - ABORT_CHECK_INTERVAL_S
        candidates = []
        for executor in self._executors:
            result, started = executor.current, executor.started_at
            if (
                result is not None
                and started is not None
                and started <= since
                and result.lease_token not in self.aborted
            ):
                candidates.append(result)
        # A buffered entry's lease ran out by `expires`; it was leased lease_ttl before (monotonic clock).
        leased_by = time.monotonic() - ABORT_CHECK_INTERVAL_S + self.backend.config.lease_ttl
        for entry in self.buffer:
            if entry.expires > leased_by:
                break  # leased in order: the rest are newer
            candidates.append(entry.result)
        return candidates

    def _drop_aborted_from_buffer(self, result: ThreadmillTaskResult, message: str) -> bool:
        """Take `result` out of the buffer, recorded FAILED with TaskCancelled unstarted; False when not buffered."""
        with self._lock:
            for entry in self.buffer:
                if entry.result is result:
                    self.buffer.remove(entry)
                    break
            else:
                return False
            mark_failed(result, cancelled_error(f"{message} It never started."), datetime.now(UTC))
            if not self.outcomes:
                self._outcomes_since = time.monotonic()
            self.outcomes.append(Outcome(result, None, None))
            self._has_work.notify()
        return True

    def _deliver_aborts(self, results: list[ThreadmillTaskResult]) -> None:
        """Look for abort requests of these runs and hand each one found to its run's executor."""
        requests = self.backend.aborts_requested(results)
        grace_s = self.backend.config.abort_grace
        for result in results:
            request = requests.get(result.lease_token)
            if request is None:
                continue
            at = datetime.fromtimestamp(request["at"], UTC).isoformat()
            message = f"Task {result.id} was aborted by {request['by']} (requested at {at})."
            if self._drop_aborted_from_buffer(result, message):
                logger.warning(
                    "Task %s: %s asked to abort it before it started; it will not run.", result.id, request["by"]
                )
                continue
            for executor in self._executors:
                if executor.current is result and executor.request_abort(result, message, grace_s):
                    with self._lock:
                        if result.lease_token in self.running:
                            self.aborted[result.lease_token] = message
                    logger.warning(
                        "Task %s: %s asked to abort it; TaskCancelled is raised in it in %g s unless it ends.",
                        result.id, request["by"], grace_s,
                    )  # fmt: skip
