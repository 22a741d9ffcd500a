"""Sentry with the real SDK and a transport that keeps what it would send: failures and transactions of tasks."""

from __future__ import annotations

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from tests.integrations import tasks
from tests.integrations.conftest import drain, drain_with_retries
from threadmill.integrations.sentry import ARGUMENTS_PREVIEW_CHARS, SPAN_FIRST


class Kept(Transport):
    """Keeps every envelope in memory instead of sending it."""

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.envelopes = []

    def capture_envelope(self, envelope) -> None:
        self.envelopes.append(envelope)

    def items(self, kind: str) -> list[dict]:
        return [item.payload.json for envelope in self.envelopes for item in envelope.items if item.type == kind]


def _init(**options) -> Kept:
    kept = Kept()
    # Auto-enabled integrations (Django, Redis) would patch code for the rest of the session.
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=kept, auto_enabling_integrations=False, **options)
    return kept


@pytest.fixture
def sentry():
    """Start Sentry as a project's settings would; `sentry(**options)` returns the transport."""
    yield _init
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def test_a_failed_task_reaches_sentry_with_its_tags_and_bounded_arguments(sentry, backend):
    kept = sentry()
    result = backend.enqueue(tasks.fail, ["x" * 5000, 2], {"user": 7})

    drain(backend)
    sentry_sdk.flush()

    [event] = kept.items("event")
    [exception] = event["exception"]["values"]
    assert exception["type"] == "RuntimeError" and exception["mechanism"]["handled"] is False
    assert event["tags"] == {
        "threadmill.task_id": result.id,
        "threadmill.task": tasks.fail.module_path,
        "threadmill.queue": "default",
        "threadmill.attempt": "1",
        "threadmill.worker": "h:1:integrations",
        "threadmill.outcome": "failed",
    }
    context = event["contexts"]["threadmill task"]
    assert context["args"].startswith('["xxx') and len(context["args"]) == ARGUMENTS_PREVIEW_CHARS
    assert context["kwargs"] == '{"user":7}'


def test_each_failed_attempt_is_reported_once_tagged_with_its_attempt(sentry, backend):
    kept = sentry()
    backend.enqueue(tasks.fail_first_attempt, [], {"note": "reported"})

    drain_with_retries(backend, attempts=2)
    sentry_sdk.flush()

    [event] = kept.items("event")  # the second attempt succeeds; Django's error log of the first is deduplicated
    assert event["tags"]["threadmill.attempt"] == "1" and event["tags"]["threadmill.outcome"] == "retried"


def _traced_runs(kept: Kept) -> list[tuple[str, str, str, str]]:
    """(name, op, status, attempt tag) of each run sent: sentry-sdk 2's transactions, or 3's segment spans."""
    if not SPAN_FIRST:
        return [
            (
                t["transaction"],
                t["contexts"]["trace"]["op"],
                t["contexts"]["trace"]["status"],
                t["tags"]["threadmill.attempt"],
            )
            for t in kept.items("transaction")
        ]
    spans = [span for payload in kept.items("span") for span in payload["items"] if span["is_segment"]]
    return [
        (s["name"], s["attributes"]["sentry.op"]["value"], s["status"], s["attributes"]["threadmill.attempt"]["value"])
        for s in sorted(spans, key=lambda s: s["start_timestamp"])
    ]


def test_each_run_is_a_transaction_when_tracing_is_on(sentry, backend):
    kept = sentry(traces_sample_rate=1.0)
    backend.enqueue(tasks.fail_first_attempt, [], {"note": "traced"})

    drain_with_retries(backend, attempts=2)
    sentry_sdk.flush()

    failed = "error" if SPAN_FIRST else "internal_error"
    path = tasks.fail_first_attempt.module_path
    assert _traced_runs(kept) == [(path, "queue.process", failed, "1"), (path, "queue.process", "ok", "2")]


def test_without_tracing_a_failure_is_reported_and_no_transaction_is_sent(sentry, backend):
    kept = sentry()
    backend.enqueue(tasks.succeed, [], {})
    backend.enqueue(tasks.fail, [], {})

    drain(backend)
    sentry_sdk.flush()

    [event] = kept.items("event")
    assert event["tags"]["threadmill.task"] == tasks.fail.module_path
    assert kept.items("transaction") == [] and kept.items("span") == []
