"""Run one leased task and return its outcome; no broker I/O happens here.

The executor belongs to one consumer thread. It runs `async def` tasks on that thread's
own event loop, created once, so an async task costs no loop setup. Everything a task
does not need per call (the signal sender, the coroutine check, the clock) is looked up
once, because at thousands of tasks a second each lookup shows in the profile. Django's
`task_started` and a success's `task_finished` go through `task_signals`, which skips a send
that only Django's log receiver would get while its level is off.

A run with a time limit is armed on the process's watchdog, which raises `TaskTimeout` in a
sync task's thread at the limit; an `async def` task is cancelled at its limit by its own loop
(`asyncio.timeout`), and `TaskTimeout` comes out of its coroutine.

An abort reaches a run through `request_abort` (the fetcher's thread): from then on
`threadmill.aborting()` is True in it, the watchdog raises `TaskCancelled` in it after the
grace (an `async def` task's coroutine is cancelled by its loop instead), and however it
ends (returns, raises, times out) it is recorded FAILED with
`TaskCancelled`, not retried. A run that ended before the request reached it keeps its outcome.

The installed integrations (`threadmill.integrations`: OpenTelemetry, Sentry) watch each run:
started just before the task code, ended once its outcome is known and before `task_finished`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import close_old_connections
from django.tasks import TaskContext
from django.tasks.signals import task_finished
from django.utils.json import normalize_json

from ..base import ThreadmillTaskResult
from ..exceptions import TaskCancelled, TaskTimeout
from ..integrations import attempt_observers
from ..outcome import error_of, mark_failed, mark_successful, retry_delay
from . import task_signals
from .logs import running_task

if TYPE_CHECKING:
    from .watchdog import Watchdog

logger = logging.getLogger("threadmill.worker")


class Outcome(NamedTuple):
    """A finished task: its result (status set), its return value and, to retry it, the delay."""

    result: ThreadmillTaskResult
    return_value: Any
    retry_after: timedelta | None


class Executor:
    """Runs tasks on the calling thread, firing Django's task signals around each one."""

    def __init__(self, sender: type, watchdog: Watchdog) -> None:
        self.sender = sender
        self.watchdog = watchdog
        self._loop: asyncio.AbstractEventLoop | None = None
        #: True when the thread waited for work since its last task; the next task first closes stale connections.
        self.idle = True
        #: `time.perf_counter()` when the task running now started, None between tasks (read by the fetcher).
        self.started_at: float | None = None
        self._is_async: dict[Any, bool] = {}
        #: The result whose task code runs now, None outside it (the watchdog's abort reads it).
        self.current: ThreadmillTaskResult | None = None
        #: Lease token of the run an abort was requested for, and what its TaskCancelled says.
        self.abort_token = ""
        self.abort_message = ""
        #: The asyncio task of the `async def` task running now, None otherwise (an abort cancels it).
        self._coroutine: asyncio.Task | None = None
        #: The consumer thread this executor runs on.
        self.thread_id = threading.get_ident()
        #: The integrations watching each attempt (OpenTelemetry, Sentry); empty when none is installed.
        self.observers = attempt_observers()

    def request_abort(self, result: ThreadmillTaskResult, message: str, grace_s: float) -> bool:
        """Abort the run of `result` if it still runs (any thread): TaskCancelled in it after `grace_s`.

        Returns False when the run had already ended: its outcome stands.
        """
        self.abort_message = message
        self.abort_token = result.lease_token
        is_async = self._async(result.task.func)
        if not self.watchdog.abort(self, result, grace_s, raises=not is_async):
            return False
        if is_async:
            self._cancel_coroutine_in(grace_s)
        return True

    def _cancel_coroutine_in(self, grace_s: float) -> None:
        """Have the running coroutine cancelled by its own loop `grace_s` from now (any thread).

        An asynchronous exception would land in the loop's machinery, not in the task; a
        cancellation reaches the awaiting coroutine, and its `finally` blocks run.
        """
        loop, running = self._loop, self._coroutine
        if loop is None or running is None:
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.call_later(grace_s, running.cancel))
        except RuntimeError:  # the loop closed meanwhile: the run is over
            pass

    def _end_run(self, result: ThreadmillTaskResult) -> bool:
        """Leave the task code: disarm an abort armed on it; return whether an abort reached it."""
        self.current = None
        if self.abort_token != result.lease_token:
            return False
        try:
            self.watchdog.disarm_thread(result, self.thread_id)
        except TaskCancelled:
            self.watchdog.disarm_thread(result, self.thread_id)
        return True

    def _cancelled(self, result: ThreadmillTaskResult, raised: BaseException | None) -> TaskCancelled:
        """Return the TaskCancelled an aborted run ends with, the task's own exception as its context."""
        if isinstance(raised, TaskCancelled):
            if not raised.args:  # the watchdog raises the bare class
                raised.args = (self.abort_message,)
            return raised
        cancelled = TaskCancelled(self.abort_message)
        cancelled.__context__ = raised
        return cancelled

    def run(self, result: ThreadmillTaskResult, limit_s: float | None = None) -> Outcome:
        """Run the task of `result` within `limit_s` (None: no limit), record how it ended and return the outcome."""
        task = result.task
        running_task.id, running_task.task = result.id, task
        if self.idle:
            # A connection may have gone stale while this thread waited for work. Between
            # two tasks run back to back, the check after the first one is enough.
            close_old_connections()
            self.idle = False
        task_signals.started.send(self.sender, result, logging.INFO)
        observers = self.observers
        # Started after task_started, whose receiver may raise: every watch started is ended below.
        watching = [observer.started(result) for observer in observers] if observers else None
        self.current = result
        try:
            if limit_s is None:
                value = self._call(task, result)
            else:
                value = self._bounded(task, result, limit_s)
            if self._end_run(result):
                raise self._cancelled(result, None)
            value = normalize_json(value)
        except BaseException as e:  # noqa: BLE001 - task code errors become TaskError
            # SystemExit and KeyboardInterrupt included: raised on a consumer thread they come
            # from task code (sys.exit(), exit()), as a signal the process receives runs its
            # handler on the main thread, which stops the process the bounded way.
            aborted = self._end_run(result)
            if aborted:
                e = self._cancelled(result, e)
            mark_failed(result, error_of(e), datetime.now(UTC))
            delay = None if aborted else retry_delay(result)
            if watching:
                self._observed(watching, result, e, delay is not None)
            # Sent inside the handler so Django's receiver logs the traceback.
            task_finished.send(self.sender, task_result=result)
            if delay is not None:
                logger.warning("Task %s failed on attempt %d; retrying in %s.", result.id, result.attempts, delay)
            return Outcome(result, None, delay)
        else:
            mark_successful(result, datetime.now(UTC))
            if watching:
                self._observed(watching, result, None, False)
            task_signals.finished.send(self.sender, result, logging.INFO)
            return Outcome(result, value, None)
        finally:
            close_old_connections()
            running_task.id = running_task.task = None

    def _observed(
        self, watching: list[Any], result: ThreadmillTaskResult, error: BaseException | None, retrying: bool
    ) -> None:
        """End the observers' watch of an attempt, last started first (their contexts nest)."""
        for observer, handle in zip(reversed(self.observers), reversed(watching), strict=True):
            observer.ended(handle, result, error, retrying)

    def _call(self, task, result: ThreadmillTaskResult, limit_s: float | None = None, message: str = "") -> Any:
        args = result.args
        if task.takes_context:
            args = [TaskContext(task_result=result), *args]
        func = task.func
        if self._async(func):
            coroutine = func(*args, **result.kwargs)
            if limit_s is not None:
                coroutine = _within(coroutine, limit_s, message)
            loop = self.loop
            self._coroutine = loop.create_task(coroutine)
            try:
                return loop.run_until_complete(self._coroutine)
            finally:
                self._coroutine = None
        return func(*args, **result.kwargs)

    def _bounded(self, task, result: ThreadmillTaskResult, limit_s: float) -> Any:
        message = f"Task {result.id} passed its time limit of {limit_s:g} s."
        if self._async(task.func):
            armed = self.watchdog.arm(result, limit_s, raises=False)
            try:
                return self._call(task, result, limit_s, message)
            finally:
                self.watchdog.disarm(armed)
        armed = self.watchdog.arm(result, limit_s, raises=True)
        try:
            return self._call(task, result)
        except TaskTimeout as e:
            if not e.args:  # the watchdog raises the bare class: say which limit it passed
                e.args = (message,)
            raise
        finally:
            self.watchdog.disarm(armed)

    def _async(self, func) -> bool:
        """Whether `func` is an `async def` function, looked up once per function."""
        is_async = self._is_async.get(func)
        if is_async is None:
            is_async = self._is_async[func] = iscoroutinefunction(func)
        return is_async

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """This consumer thread's event loop, created on the first async task."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def close(self) -> None:
        """Close the event loop, if one was created."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None


async def _within(coroutine, limit_s: float, message: str) -> Any:
    """Await `coroutine`, cancelled at `limit_s`: then TaskTimeout comes out of it (its own TimeoutError stays)."""
    limit = asyncio.timeout(limit_s)
    try:
        async with limit:
            return await coroutine
    except TimeoutError:
        if limit.expired():
            raise TaskTimeout(message)
        raise
