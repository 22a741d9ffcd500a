"""A worker process's per-task-path counts (`threadmill.backends.taskstats`) not yet sent to the server.

The fetcher adds each attempt whose acknowledgement (or retry) the server accepted, and sends
the counts at most once every `FLUSH_INTERVAL_S` in one call, never on a task's own path.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

from django.tasks import TaskResultStatus

from ..backends.taskstats import BOUNDS_S, FLUSH_INTERVAL_S

if TYPE_CHECKING:
    from .executor import Outcome

_RUNS, _SUCCESSFUL, _FAILED, _RETRIED, _RUN_US, _WAITS, _WAIT_US = range(7)
_NAMES = ("runs", "successful", "failed", "retried", "run_us", "waits", "wait_us")
_BUCKETS = len(BOUNDS_S) + 1
_RUN_B = len(_NAMES)
_WAIT_B = _RUN_B + _BUCKETS
_SIZE = _WAIT_B + _BUCKETS
_SUCCESS = TaskResultStatus.SUCCESSFUL


class TaskStatsCounts:
    """Counts by (queue, task function) since the last send; `take` turns them into the script's shape."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, object], list[int]] = {}
        self._paths: dict[tuple[str, object], str] = {}
        self._errors: dict[tuple[str, object], dict[str, int]] = {}
        self._unsent: dict[str, dict[str, dict[str, int]]] = {}
        self.next_send_at = 0.0

    def __bool__(self) -> bool:
        return bool(self._counts or self._unsent)

    def add(self, outcome: Outcome, retried: bool) -> None:
        """Count one finished attempt: its outcome, run time and, for a first attempt, its queue wait."""
        result = outcome.result
        task = result.task
        key = (task.queue_name, task.func)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * _SIZE
            self._paths[key] = task.module_path
        counts[_RUNS] += 1
        # The run's start and end, set by its consumer (None for a task that never started).
        ran = result.ran
        ran_s = 0.0 if ran is None else ran[1] - ran[0]
        counts[_RUN_US] += int(ran_s * 1e6)
        counts[_RUN_B + bisect_left(BOUNDS_S, ran_s)] += 1
        if result.status is _SUCCESS:
            counts[_SUCCESSFUL] += 1
        else:
            counts[_RETRIED if retried else _FAILED] += 1
            if result.errors:
                errors = self._errors.setdefault(key, {})
                name = result.errors[-1].exception_class_path
                errors[name] = errors.get(name, 0) + 1
        if len(result.worker_ids) == 1 and result.last_attempted_at is not None and result.enqueued_at is not None:
            ready_at = result.enqueued_at
            run_after = task.run_after
            if run_after is not None and run_after > ready_at:
                ready_at = run_after
            wait_s = max(0.0, (result.last_attempted_at - ready_at).total_seconds())
            counts[_WAITS] += 1
            counts[_WAIT_US] += int(wait_s * 1e6)
            counts[_WAIT_B + bisect_left(BOUNDS_S, wait_s)] += 1

    def take(self, now: float) -> dict[str, dict[str, dict[str, int]]]:
        """Return the counts as {queue: {path: {name: increment}}} (non-zero only) and start afresh."""
        out, self._unsent = self._unsent, {}
        for key, counts in self._counts.items():
            named = {name: counts[i] for i, name in enumerate(_NAMES) if counts[i]}
            for i in range(_BUCKETS):
                if counts[_RUN_B + i]:
                    named[f"run_b{i}"] = counts[_RUN_B + i]
                if counts[_WAIT_B + i]:
                    named[f"wait_b{i}"] = counts[_WAIT_B + i]
            for error, n in self._errors.get(key, {}).items():
                named[f"error|{error}"] = n
            # Two functions of one path (a reloaded module) add up.
            _merge(out, {key[0]: {self._paths[key]: named}})
        self._counts, self._errors = {}, {}
        self.next_send_at = now + FLUSH_INTERVAL_S
        return out

    def put_back(self, taken: dict[str, dict[str, dict[str, int]]]) -> None:
        """Keep counts whose send failed: the next `take` returns them too."""
        _merge(self._unsent, taken)


def _merge(into: dict[str, dict[str, dict[str, int]]], counts: dict[str, dict[str, dict[str, int]]]) -> None:
    for queue, paths in counts.items():
        for path, named in paths.items():
            target = into.setdefault(queue, {}).setdefault(path, {})
            for name, n in named.items():
                target[name] = target.get(name, 0) + n
