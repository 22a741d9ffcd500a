"""The watchdog: one thread per worker process that holds its running tasks to their time limits and aborts.

A consumer arms it for a run with a limit and disarms it when the run ends. At the limit a sync
task gets `TaskTimeout` as an asynchronous exception in its consumer thread: Python raises it
between two bytecodes, so its `finally` blocks run, but a call blocked in C (a socket read, a
`select`) sees it only once that call returns. An `async def` task is cancelled by its own event
loop (the executor's `asyncio.timeout`), so the watchdog only watches it. A run still armed
`grace` after its limit is given up: `on_stuck` is called once for it, on this thread, and the
process replaces itself.

An abort (an operator's cancel of a running task) arms the run the same way, from the fetcher
thread: `TaskCancelled` at `abort_grace` after the request reached it, given up `grace` later.
A run under a limit keeps one entry, due at whichever comes first. The fetcher arms only a run
its consumer has not finished: it names the run to abort on the executor (`abort_token`), then
looks, under this lock, whether that run is still the executor's `current`; the consumer clears
`current`, then looks at `abort_token` and, if it names its run, disarms under this lock. The
GIL orders the four steps, so either the fetcher sees the run gone or the consumer disarms.

Invariants: at most one exception is raised per run, and none once the run is disarmed (the
raise and the disarm take the same lock, and the disarm clears one raised but not yet delivered).
The moment the supervisor kills the process, should it not even manage to replace itself (a C
call holding the GIL stops every thread), is kept in `kill_at` (shared memory): the earliest
give-up moment of the armed runs plus `grace`, on the monotonic clock every process shares.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base import ThreadmillTaskResult
from ..exceptions import TaskCancelled, TaskTimeout

logger = logging.getLogger("threadmill.worker")

# Two function objects (indexing makes a new one), so each keeps its own argument types.
_set_async_exc = ctypes.pythonapi["PyThreadState_SetAsyncExc"]
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_clear_async_exc = ctypes.pythonapi["PyThreadState_SetAsyncExc"]
_clear_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)


@dataclass(slots=True, eq=False)
class Armed:
    """One run under a time limit: its consumer thread, its task and the monotonic moments it is due."""

    thread_id: int
    result: ThreadmillTaskResult
    limit_s: float
    #: When TaskTimeout is raised in its thread; infinity for an async task (its loop cancels it).
    raise_at: float
    give_up_at: float
    raised: bool = False
    #: What is raised at `raise_at`: TaskTimeout at the limit, TaskCancelled at an abort's grace.
    exception: type[BaseException] = TaskTimeout


class Watchdog:
    """Raises TaskTimeout in runs past their limit and gives up those still running `grace` later."""

    def __init__(self, grace_s: float, on_stuck: Callable[[Armed], None], kill_at: Any = None) -> None:
        self.grace_s = grace_s
        self.on_stuck = on_stuck
        #: A shared `ctypes.c_double` (or None) the supervisor reads: kill this process from then on.
        self.kill_at = kill_at
        self._armed: dict[int, Armed] = {}
        self._giving_up = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, result: ThreadmillTaskResult, limit_s: float, *, raises: bool) -> Armed:
        """Watch the calling thread's run of `result` for `limit_s`; `raises` False for an async task."""
        now = time.monotonic()
        armed = Armed(
            threading.get_ident(),
            result,
            limit_s,
            now + limit_s if raises else float("inf"),
            now + limit_s + self.grace_s,
        )
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                self._thread.start()
            self._armed[armed.thread_id] = armed
            self._publish_kill_at()
            self._changed.notify()
        return armed

    def disarm(self, armed: Armed) -> None:
        """Stop watching `armed`; a TaskTimeout raised in the run while this runs still comes out of it."""
        try:
            self._disarm(armed)
        except (TaskTimeout, TaskCancelled):
            # Delivered inside the first call: there is no second one, so this one completes.
            self._disarm(armed)
            raise

    def abort(self, executor: Any, result: ThreadmillTaskResult, grace_s: float, *, raises: bool) -> bool:
        """Arm `executor`'s run of `result` to get TaskCancelled in `grace_s`; False when that run is over.

        The caller named the run in `executor.abort_token` first (see the module docstring).
        """
        now = time.monotonic()
        with self._changed:
            if executor.current is not result:
                return False
            thread_id = executor.thread_id
            armed = self._armed.get(thread_id)
            if armed is None or armed.result is not result:
                armed = Armed(thread_id, result, grace_s, float("inf"), float("inf"), exception=TaskCancelled)
                self._armed[thread_id] = armed
            if raises and not armed.raised and now + grace_s < armed.raise_at:
                armed.raise_at, armed.exception, armed.limit_s = now + grace_s, TaskCancelled, grace_s
            armed.give_up_at = min(armed.give_up_at, now + grace_s + self.grace_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                self._thread.start()
            self._publish_kill_at()
            self._changed.notify()
        return True

    def disarm_thread(self, result: ThreadmillTaskResult, thread_id: int) -> None:
        """Stop watching `thread_id`'s run of `result`, if it is still watched (an abort armed it)."""
        with self._changed:
            armed = self._armed.get(thread_id)
        if armed is not None and armed.result is result:
            self.disarm(armed)

    def _disarm(self, armed: Armed) -> None:
        with self._changed:
            if self._armed.get(armed.thread_id) is armed:
                del self._armed[armed.thread_id]
                self._publish_kill_at()
            raised = armed.raised
        if raised:
            # Raised just before the disarm and not delivered yet: it must not hit the code after the run.
            _clear_async_exc(armed.thread_id, None)

    def _publish_kill_at(self) -> None:
        if self.kill_at is not None and not self._giving_up:
            soonest = min((a.give_up_at for a in self._armed.values()), default=float("inf"))
            self.kill_at.value = soonest + self.grace_s

    def _watch(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                for armed in list(self._armed.values()):
                    if now >= armed.give_up_at:
                        self._give_up(armed)
                    elif now >= armed.raise_at and not armed.raised:
                        armed.raised = True
                        _set_async_exc(armed.thread_id, armed.exception)
                due = [
                    a.give_up_at if a.raised or a.raise_at == float("inf") else a.raise_at for a in self._armed.values()
                ]
                self._changed.wait(max(0.0, min(due) - now) if due else None)

    def _give_up(self, armed: Armed) -> None:
        """Hand a run that outlived its grace to `on_stuck` (the lock held, released around the call)."""
        del self._armed[armed.thread_id]
        self._giving_up = True
        logger.error(
            "Task %s did not end %g s after its %s of %g s; this worker process is replaced.",
            armed.result.id,
            self.grace_s,
            "abort's grace" if armed.exception is TaskCancelled else "time limit",
            armed.limit_s,
        )
        self._changed.release()
        try:
            self.on_stuck(armed)
        except Exception:
            logger.exception("Replacing this worker process after task %s failed.", armed.result.id)
        finally:
            self._changed.acquire()
