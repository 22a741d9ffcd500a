"""Tasks the integration tests run: each tells from its attempt how to end, so no counter is needed."""

from __future__ import annotations

from django.tasks import task

from threadmill.retry import ExponentialBackoff


@task(takes_context=True, retry=ExponentialBackoff(base_delay=0.01, max_retries=1, jitter=0))
def fail_first_attempt(context, note=""):
    """Fail the first attempt with ValueError, succeed on the second; each attempt opens a span of its own."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span(f"task code, attempt {context.attempt}"):
        if context.attempt == 1:
            raise ValueError(f"first attempt of {note} fails")
    return note


@task
def fail(*args, **kwargs):
    """Fail at once, whatever the arguments: never retried."""
    raise RuntimeError("this task always fails")


@task
def succeed(*args, **kwargs):
    return "done"
