"""Abort polling: how an abort request stored with a running task reaches its run.

While a task has run `ABORT_CHECK_INTERVAL_S` or more, the fetcher reads, at most that often
and in one read-only call, whether an abort was requested for any such run, and hands a request
to the run's executor (`Executor.request_abort`); the watchdog raises `TaskCancelled` in it
`abort_grace` later. A drain of short tasks never makes the call. A run an abort reached is
kept in the process's `aborted` (by lease token, with the message its TaskCancelled carries):
still going at the shutdown deadline, it is recorded FAILED with `TaskCancelled`, not handed back.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from ..backends.base import ThreadmillTaskResult

logger = logging.getLogger("threadmill.worker")

#: Shortest run, and pause between two looks, after which the fetcher looks for abort requests, seconds:
#: a request reaches a run within about twice this, and tasks shorter than it never cost a call.
ABORT_CHECK_INTERVAL_S = 0.5


class AbortPolling:
    """Mixed into `WorkerProcess`: the fetcher's look for abort requests and their delivery.

    Uses the process's `backend`, `_executors`, `running`, `aborted` and its lock.
    """

    def _abort_candidates(self) -> list[ThreadmillTaskResult]:
        """The runs going on for `ABORT_CHECK_INTERVAL_S` or more that no abort reached yet (the lock held)."""
        since = time.perf_counter() - ABORT_CHECK_INTERVAL_S
        candidates = []
        for executor in self._executors:
            result, started = executor.current, executor.started_at
            if result is not None and started is not None and started <= since:
                if result.lease_token not in self.aborted:
                    candidates.append(result)
        return candidates

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
            for executor in self._executors:
                if executor.current is result and executor.request_abort(result, message, grace_s):
                    with self._lock:
                        if result.lease_token in self.running:
                            self.aborted[result.lease_token] = message
                    logger.warning(
                        "Task %s: %s asked to abort it; TaskCancelled is raised in it in %g s unless it ends.",
                        result.id, request["by"], grace_s,
                    )  # fmt: skip
