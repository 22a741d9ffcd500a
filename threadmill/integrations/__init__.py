"""Optional integrations with tracing and error reporting, each used only where its package is installed.

Each integration looks its package up once, when imported: without it installed, enqueue
pays one attribute check and the worker's executor one empty-tuple check per task.
An integration that watches task runs is an `AttemptObserver` (`observer.py`); the executor asks
for the active ones once, when it is created, so a tool must be set up (in settings) before the
worker starts.
"""

from __future__ import annotations

import sys

from .observer import AttemptObserver


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
