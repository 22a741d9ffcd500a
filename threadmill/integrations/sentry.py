"""Sentry: each failed attempt reported with the task's tags and arguments, a transaction per attempt.

Used when `sentry-sdk` is installed (the `sentry` extra) and `sentry_sdk.init` ran before the
worker started (in settings, as Sentry's Django guide does). Each attempt runs in a scope of
its own tagged with the task's id, path, queue, attempt and worker; its arguments go in the
"threadmill task" context, cut to `ARGUMENTS_PREVIEW_CHARS` each. A failed attempt is reported
once (tagged `threadmill.outcome` retried or failed); with tracing on, each attempt is a
transaction "queue.process" named after the task path. sentry-sdk 2 and 3 both work: 3 has no
transactions, so there each attempt is a segment span of that op and name, with the tags as its
attributes and status "ok" or "error".
"""

from __future__ import annotations

from typing import Any, cast

from ..base import ThreadmillTaskResult, json_preview
from .observer import outcome_of

try:
    import sentry_sdk
    from sentry_sdk.tracing_utils import has_tracing_enabled
    from sentry_sdk.utils import event_from_exception
except ImportError:  # the `sentry` extra is not installed: nothing here is used
    sentry_sdk = None  # type: ignore[assignment]

#: sentry-sdk 3 and later stream spans ("span first") and have no transactions; 2 has them.
SPAN_FIRST = sentry_sdk is not None and not hasattr(sentry_sdk, "start_transaction")
#: What an unhandled failure is reported as: the worker records it, but nothing in the task handled it.
MECHANISM = {"type": "threadmill", "handled": False}

#: Most characters of a task's args and of its kwargs (as JSON) sent with a report.
ARGUMENTS_PREVIEW_CHARS = 1024


class Reporting:
    """Runs each attempt in its own Sentry scope and, with tracing on, transaction."""

    def started(self, result: ThreadmillTaskResult) -> tuple[Any, Any, Any]:
        task = result.task
        isolation = sentry_sdk.isolation_scope()
        scope = isolation.__enter__()
        tags = {
            "threadmill.task_id": result.id,
            "threadmill.task": task.module_path,
            "threadmill.queue": task.queue_name,
            "threadmill.attempt": str(result.attempts),
            "threadmill.worker": result.lease_worker,
        }
        scope.set_tags(tags)
        # The arguments go in only when an event is sent: JSON for every run cost more than the tags.
        scope.add_event_processor(_with_arguments(result))
        transaction = None
        if has_tracing_enabled(sentry_sdk.get_client().options):
            if SPAN_FIRST:
                # A span carries attributes, not the scope's tags; parent None makes it its own segment.
                attributes = {"sentry.op": "queue.process", "sentry.segment.name.source": "task", **tags}
                transaction = sentry_sdk.start_span(name=task.module_path, attributes=attributes, parent_span=None)
            else:
                start_transaction = getattr(sentry_sdk, "start_transaction")  # noqa: B009 - absent from 3's types
                transaction = start_transaction(op="queue.process", name=task.module_path, source="task")
            transaction.__enter__()
        return isolation, scope, transaction

    def ended(self, handle: Any, result: ThreadmillTaskResult, error: BaseException | None, retrying: bool) -> None:
        isolation, scope, transaction = handle
        outcome = outcome_of(result, retrying)
        scope.set_tag("threadmill.outcome", outcome)
        if error is not None:
            if SPAN_FIRST:  # 3 reads the client's options itself
                event, hint = event_from_exception(error, mechanism=MECHANISM)
            else:
                options = sentry_sdk.get_client().options
                event, hint = cast(Any, event_from_exception)(error, client_options=options, mechanism=MECHANISM)
            sentry_sdk.capture_event(event, hint=hint)
        if transaction is not None:
            if SPAN_FIRST:
                transaction.status = "ok" if outcome == "successful" else "error"
            else:
                transaction.set_status("ok" if outcome == "successful" else "internal_error")
            transaction.__exit__(None, None, None)
        isolation.__exit__(None, None, None)


def _with_arguments(result: ThreadmillTaskResult):
    """Return an event processor that adds the task's arguments (bounded) as the "threadmill task" context."""

    def add(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
        event.setdefault("contexts", {})["threadmill task"] = {
            "args": json_preview(result.args, ARGUMENTS_PREVIEW_CHARS),
            "kwargs": json_preview(result.kwargs, ARGUMENTS_PREVIEW_CHARS),
            "backend": result.backend,
            "enqueued_at": result.enqueued_at.isoformat() if result.enqueued_at else None,
        }
        return event

    return add


def attempt_observer() -> Reporting | None:
    """Return the attempt observer when sentry-sdk is installed and initialised, else None."""
    if sentry_sdk is None or not sentry_sdk.get_client().is_active():
        return None
    return Reporting()
