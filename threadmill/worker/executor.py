"""Run one leased task and return its outcome; no broker I/O happens here.

The executor belongs to one consumer thread. It runs `async def` tasks on that thread's
own event loop, created once, so an async task costs no loop setup. Everything a task
does not need per call (the signal sender, the coroutine check, the clock) is looked up
once, because at thousands of tasks a second each lookup shows in the profile.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from inspect import iscoroutinefunction
from typing import Any, NamedTuple

from django.db import close_old_connections
from django.tasks import TaskContext
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from ..backends.base import ThreadmillTaskResult
from ..logs import running_task
from ..outcome import error_of, mark_failed, mark_successful, retry_delay

logger = logging.getLogger("threadmill.worker")


class Outcome(NamedTuple):
    """A finished task: its result (status set), its return value and, to retry it, the delay."""

    result: ThreadmillTaskResult
    return_value: Any
    retry_after: timedelta | None


class Executor:
    """Runs tasks on the calling thread, firing Django's task signals around each one."""

    def __init__(self, sender: type) -> None:
        self.sender = sender
        self._loop: asyncio.AbstractEventLoop | None = None
        #: True when the thread waited for work since its last task; the next task first closes stale connections.
        self.idle = True
        self._is_async: dict[Any, bool] = {}

    def run(self, result: ThreadmillTaskResult) -> Outcome:
        """Run the task of `result`, record how it ended on `result` and return the outcome."""
        task = result.task
        running_task.id, running_task.task = result.id, task
        if self.idle:
            # A connection may have gone stale while this thread waited for work. Between
            # two tasks run back to back, the check after the first one is enough.
            close_old_connections()
            self.idle = False
        task_started.send(self.sender, task_result=result)
        try:
            value = normalize_json(self._call(task, result))
        except BaseException as e:  # noqa: BLE001 - task code errors become TaskError
            # SystemExit and KeyboardInterrupt included: raised on a consumer thread they come
            # from task code (sys.exit(), exit()), as a signal the process receives runs its
            # handler on the main thread, which stops the process the bounded way.
            mark_failed(result, error_of(e), datetime.now(UTC))
            delay = retry_delay(result)
            # Sent inside the handler so Django's receiver logs the traceback.
            task_finished.send(self.sender, task_result=result)
            if delay is not None:
                logger.warning("Task %s failed on attempt %d; retrying in %s.", result.id, result.attempts, delay)
            return Outcome(result, None, delay)
        else:
            mark_successful(result, datetime.now(UTC))
            task_finished.send(self.sender, task_result=result)
            return Outcome(result, value, None)
        finally:
            close_old_connections()
            running_task.id = running_task.task = None

    def _call(self, task, result: ThreadmillTaskResult) -> Any:
        args = result.args
        if task.takes_context:
            args = [TaskContext(task_result=result), *args]
        func = task.func
        is_async = self._is_async.get(func)
        if is_async is None:
            is_async = self._is_async[func] = iscoroutinefunction(func)
        if is_async:
            return self.loop.run_until_complete(func(*args, **result.kwargs))
        return func(*args, **result.kwargs)

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
