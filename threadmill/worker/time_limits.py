"""Time limits, as a worker process keeps them: a lease that covers the run, and giving a run up.

The watchdog (`watchdog.py`) raises `TaskTimeout` in a run at its limit. Before a run with a
limit starts, its lease is made to outlast the limit and its escalation (`_cover_lease`), so the
reaper never takes a live, bounded task back early. A task that did not end `timeout_grace`
after its limit (or after an abort's `TaskCancelled`) is given up (`_give_up`, on the
watchdog's thread): it is recorded FAILED with TaskTimeout (or requeued, as its retry policy
says; an aborted one FAILED with TaskCancelled), the process moves to STOPPING with the
shutdown deadline now, the other running tasks are handed back as interrupted attempts, and the
process exits with `EXIT_TIMED_OUT`: its supervisor replaces it at once.
"""

from __future__ import annotations

import copy
import logging
import time
from datetime import UTC, datetime

from ..base import ThreadmillTaskResult
from ..exceptions import TaskCancelled, TaskTimeout
from ..outcome import error_of, mark_failed, retry_delay
from .executor import Outcome
from .host import ProcessHost
from .state import Phase
from .watchdog import Armed

logger = logging.getLogger("threadmill.worker")


class TimeLimits(ProcessHost):
    """Mixed into `WorkerProcess`: covers a bounded run's lease and replaces the process when a run outlives its grace.

    Uses the process's `backend`, `watchdog`, `running`, `aborted`, `outcomes`, its lock,
    `_enter` and the shutdown fields.
    """

    def _give_up(self, armed: Armed) -> None:
        """Replace this process: a task did not end `timeout_grace` after its limit (the watchdog's thread)."""
        result, now = armed.result, time.monotonic()
        with self._lock:
            if self.running.pop(result.lease_token, None) is None:
                return  # it ended, or was handed back, meanwhile
            timed_out = copy.copy(result)
            object.__setattr__(timed_out, "errors", list(result.errors))
            aborted = self.aborted.pop(result.lease_token, None)
            if aborted is not None:
                message = f"{aborted} It had not ended {armed.limit_s + self.watchdog.grace_s:g} s later; "
                mark_failed(timed_out, error_of(TaskCancelled(f"{message}worker {self.name} was replaced.")),
                            datetime.now(UTC))  # fmt: skip
            else:
                message = (
                    f"Task {result.id} passed its time limit of {armed.limit_s:g} s and had not ended "
                    f"{self.watchdog.grace_s:g} s later; worker {self.name} was replaced."
                )
                mark_failed(timed_out, error_of(TaskTimeout(message)), datetime.now(UTC))
            if not self.outcomes:
                self._outcomes_since = now
            self.outcomes.append(Outcome(timed_out, None, None if aborted is not None else retry_delay(timed_out)))
            self.timed_out = True
            self._interrupted_because = f"was replaced after task {result.id} outlived its time limit"
            self._shutdown_at = now
            if self.phase is Phase.STOPPED:
                return
            if self.phase is not Phase.STOPPING:
                self._enter(Phase.STOPPING)
            self._has_work.notify()

    def _cover_lease(self, result: ThreadmillTaskResult, expires: float, limit_s: float) -> bool:
        """Make the lease outlast the run and its escalation; False when it must not run (dropped or handed back).

        A run ends by its limit + grace, or the process is replaced; its supervisor kills it one
        grace later still. Only a lease shorter than that costs a round trip.
        """
        cover_s = limit_s + 2 * self.watchdog.grace_s
        if time.monotonic() + cover_s <= expires:
            return True
        try:
            if self.backend.extend_lease(result, cover_s):
                return True
            logger.warning("Task %s was taken back before it started; it is not run here.", result.id)
            unstarted = []
        except Exception as e:  # noqa: BLE001 - without a lease that covers the run it must not start
            logger.warning("Extending the lease of task %s failed (%s); it is handed back, not run.", result.id, e)
            unstarted = [result]
        self._drop_unstarted(result, unstarted)
        return False
