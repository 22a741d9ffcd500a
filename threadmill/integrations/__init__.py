"""Optional integrations with tracing and error reporting, each used only where its package is installed.

Each integration looks its package up once, when imported: without it installed, enqueue
pays one attribute check and the worker's executor one empty-tuple check per task.
An integration that watches task runs is an `AttemptObserver` (`observer.py`); the executor asks
for the active ones once, when it is created, so a tool must be set up (in settings) before the
worker starts.
"""

from __future__ import annotations

from .observer import AttemptObserver


def attempt_observers() -> tuple[AttemptObserver, ...]:
    """Return the observers of the integrations installed and set up in this process."""
    # Imported when a worker asks: a producer that never runs tasks does not look Sentry up.
    from . import otel, sentry

    return tuple(observer for observer in (otel.attempt_observer(), sentry.attempt_observer()) if observer)
