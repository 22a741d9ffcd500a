"""Suspects: tasks that were in a lost worker's lease, run so that the next loss is blamed exactly.

A consumer records a suspect's start and finish on the server (`record_progress`), and one that
would fail at its next lost worker runs alone (`runs_alone`): nothing else starts while it runs,
and it waits until nothing else runs, so that loss is its own.
"""

from __future__ import annotations

import logging

from ..base import ThreadmillTaskResult
from ..outcome import runs_alone
from .host import ProcessHost

logger = logging.getLogger("threadmill.worker")


class Suspects(ProcessHost):
    """Mixed into `WorkerProcess`: the consumers' part in blaming a lost worker on the right task.

    Uses the process's `backend`, `buffer`, `running`, `_alone` and `_drop_unstarted`.
    """

    def _held_back(self) -> bool:
        """Whether the next buffered task must wait (the lock held): one that runs alone, or any while one does."""
        return bool(self.running) and (self._alone in self.running or runs_alone(self.buffer[0].result))

    def _record_start(self, result: ThreadmillTaskResult) -> bool:
        """Record a suspect's start on the server; False when it must not run (it is dropped or handed back)."""
        try:
            if self.backend.record_progress(result, "started"):
                return True
            logger.warning("Task %s was taken back before it started; it is not run here.", result.id)
            unstarted = []
        except Exception as e:  # noqa: BLE001 - unrecorded, the start could not be blamed exactly
            logger.warning("Recording the start of task %s failed (%s); it is handed back, not run.", result.id, e)
            unstarted = [result]
        self._drop_unstarted(result, unstarted)
        return False

    def _record_finish(self, result: ThreadmillTaskResult) -> None:
        try:
            self.backend.record_progress(result, "finished")
        except Exception as e:  # noqa: BLE001 - a lost worker then blames this run, as it would without a record
            logger.warning("Recording the finish of task %s failed: %s", result.id, e)
