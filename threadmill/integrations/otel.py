"""OpenTelemetry traces: an enqueue span, the W3C trace context stored in the task, a span per attempt.

Used when `opentelemetry-api` is installed (the `otel` extra) and a tracer provider (the SDK's)
is set up; the API is imported only once one may be (`is_set_up`: it is imported already, or
`OTEL_PYTHON_TRACER_PROVIDER` names a provider), its propagator once one is, and the spans go wherever
it sends them. The worker looks once, when it starts, so the provider must be set up by then (in settings, `AppConfig.ready` or `opentelemetry-instrument`). `enqueue` runs in a
producer span "send <queue>" and stores its W3C trace context (`traceparent`, `tracestate`)
in the task. Each attempt runs in a consumer span "process <queue>" that is a child of that
span, so a request's trace goes on into the worker, retries included. A task enqueued with
`run_after` is the exception: its attempts start a trace of their own linked to the
enqueue, because a trace held open until a deferred run hours later is one no backend keeps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..base import ThreadmillTaskResult
from .observer import outcome_of

#: The value of `messaging.system` on Threadmill's spans.
MESSAGING_SYSTEM = "threadmill"

# The API's names, bound by `_load` once a tracer provider may be set up; until then none is imported.
otel_context: Any = None
trace: Any = None
Link: Any = None
SpanKind: Any = None
StatusCode: Any = None
#: The tracer of Threadmill's spans: a proxy, so a provider set up after the load is used.
tracer: Any = None
#: The stored context is W3C trace context whatever the process's propagators are.
_w3c: Any = None
#: Whether the API is installed; None until `_load` looked.
_installed: bool | None = None


def _load() -> bool:
    """Import the API and bind its names here, once; return whether it is installed (the `otel` extra)."""
    global otel_context, trace, Link, SpanKind, StatusCode, tracer, _w3c, _installed
    if _installed is None:
        try:
            from opentelemetry import context as otel_context
            from opentelemetry import trace
            from opentelemetry.trace import Link, SpanKind, StatusCode
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:  # the `otel` extra is not installed: nothing here is used
            _installed = False
            return False
        tracer, _w3c = trace.get_tracer("threadmill"), TraceContextTextMapPropagator()
        _installed = True
    return _installed


def is_set_up() -> bool:
    """Whether a tracer provider is set up in this process (an SDK's), not the API's default no-op proxy.

    Without one every span is a no-op, and skipping them saves the worker about 5 µs a task
    (the integrations benchmark).
    """
    # Looked up, not imported: an import statement per enqueue cost more than the rest of this look (#30).
    api: Any = sys.modules.get("opentelemetry.trace")
    if api is None:
        if "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ:
            return False
        try:
            from opentelemetry import trace as api
        except ImportError:  # the `otel` extra is not installed
            return False
    # Asked before `_load`: where redis-py imported the API without any provider set up, the
    # propagator `_load` imports cost a worker's start about 4 ms, for no span.
    if isinstance(api.get_tracer_provider(), (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return False
    return _load()


@contextmanager
def sending(backend: str, task: Any, count: int) -> Iterator[dict[str, str] | None]:
    """Run an enqueue of `count` tasks in a producer span; yield its trace context to store, None if none."""
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": task.queue_name,
        "threadmill.backend": backend,
        "threadmill.task.path": task.module_path,
    }
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(f"send {task.queue_name}", kind=SpanKind.PRODUCER, attributes=attributes):
        carrier: dict[str, str] = {}
        _w3c.inject(carrier)
        yield carrier or None


class Tracing:
    """Runs each attempt in a consumer span, current while the task code runs."""

    def started(self, result: ThreadmillTaskResult) -> tuple[Any, object]:
        task = result.task
        parent, links = otel_context.Context(), None
        if result.trace_context:
            enqueued = _w3c.extract(result.trace_context)
            if task.run_after is None:
                parent = enqueued
            else:
                links = [Link(trace.get_current_span(enqueued).get_span_context())]
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": task.queue_name,
            "messaging.message.id": result.id,
            "threadmill.backend": result.backend,
            "threadmill.task.path": task.module_path,
            "threadmill.task.attempt": result.attempts,
            "threadmill.worker": result.lease_worker,
        }
        span = tracer.start_span(
            f"process {task.queue_name}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes, links=links
        )
        return span, otel_context.attach(trace.set_span_in_context(span))

    def ended(self, handle: Any, result: ThreadmillTaskResult, error: BaseException | None, retrying: bool) -> None:
        span, token = handle
        span.set_attribute("threadmill.task.outcome", outcome_of(result, retrying))
        if error is not None:
            span.record_exception(error)
            span.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        span.end()
        otel_context.detach(token)


def attempt_observer() -> Tracing | None:
    """Return the attempt observer when opentelemetry-api is installed and a tracer provider set up, else None."""
    return Tracing() if is_set_up() else None
