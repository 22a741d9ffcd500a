"""Optional integrations with tracing and error reporting, each used only where its package is installed.

Each integration looks its package up once, when imported: without it installed, enqueue
pays one attribute check and the worker's executor one empty-tuple check per task.
An integration that watches task runs is an `AttemptObserver`; the executor asks for the
active ones once, when it is created, so a tool must be set up (in settings) before the worker starts.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from ..backends.base import ThreadmillTaskResult


class AttemptObserver(Protocol):
    """Watches each attempt of a task on a worker; both calls come from the consumer thread running it."""

    def started(self, result: ThreadmillTaskResult) -> Any:
        """Begin watching the attempt of `result` that starts now; return what `ended` needs."""

    def ended(self, handle: Any, result: ThreadmillTaskResult, error: BaseException | None, retrying: bool) -> None:
        """Finish watching: `result` carries its status, `error` what the task raised, `retrying` whether it runs again."""


def attempt_observers() -> tuple[AttemptObserver, ...]:
    """Return the observers of the integrations installed and set up in this process."""
    from . import otel

    observers: list[AttemptObserver | None] = [otel.attempt_observer()]
    # Only `sentry_sdk.init` sets Sentry up, and it imported the package: without that, the
    # import is 50 ms wasted at the start of every worker process (it runs after the fork).
    if "sentry_sdk" in sys.modules:
        from . import sentry

        observers.append(sentry.attempt_observer())
    return tuple(observer for observer in observers if observer)


def outcome_of(result: ThreadmillTaskResult, retrying: bool) -> str:
    """Return how an attempt ended, in the words of the per-task metrics: successful, retried or failed."""
    if retrying:
        return "retried"
    return "successful" if result.status == "SUCCESSFUL" else "failed"
