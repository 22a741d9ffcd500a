"""OpenTelemetry with the real SDK and its in-memory exporter: from a request through enqueue to each attempt."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import SpanKind, StatusCode

from tests.faults.test_rolling_deploy import previous_release  # noqa: F401 - a fixture
from tests.integrations import tasks
from tests.integrations.conftest import drain, drain_with_retries
from tests.tasks import echo
from tests.worker.conftest import DEADLINE_S, worker_env
from threadmill.backends import codec
from threadmill.base import Segment


class Switch(Sampler):
    """Samples every span while a test here runs, none in the rest of the session (the provider is global)."""

    on = False

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None):
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP, attributes)

    def get_description(self) -> str:
        return "Switch"


_switch = Switch()
_exporter = InMemorySpanExporter()


def _reset_trace_globals() -> None:
    """Forget the global tracer provider, as OpenTelemetry's own test utilities do between tests.

    Without it the SDK provider set here stays for the rest of the session, and every task
    enqueued by a later test stores a (random, unsampled) trace context in its payload.
    """
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans():
    """The spans this test records, through an SDK tracer provider set as the global one for the test."""
    provider = TracerProvider(sampler=_switch)
    provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(provider)
    _exporter.clear()
    _switch.on = True
    yield _exporter
    _switch.on = False
    _exporter.clear()
    _reset_trace_globals()


def _named(spans, name: str) -> list:
    return sorted((s for s in spans.get_finished_spans() if s.name == name), key=lambda s: s.start_time)


def _traceparent(span) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_a_span_tree_runs_from_the_request_through_enqueue_to_each_attempt_and_its_retry(spans, backend):
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        result = backend.enqueue(tasks.fail_first_attempt, [], {"note": "traced"})

    drain_with_retries(backend, attempts=2)

    assert backend.get_result(result.id).status == "SUCCESSFUL"
    [send] = _named(spans, "send default")
    first, second = _named(spans, "process default")
    assert send.kind is SpanKind.PRODUCER and send.parent.span_id == request.get_span_context().span_id
    assert send.context.trace_id == request.get_span_context().trace_id
    for attempt, span in enumerate((first, second), 1):
        assert span.kind is SpanKind.CONSUMER
        assert span.parent.span_id == send.context.span_id and span.context.trace_id == send.context.trace_id
        assert span.attributes["messaging.system"] == "threadmill"
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["messaging.message.id"] == result.id
        assert span.attributes["threadmill.task.path"] == tasks.fail_first_attempt.module_path
        assert span.attributes["threadmill.task.attempt"] == attempt
        [code] = _named(spans, f"task code, attempt {attempt}")
        assert code.parent.span_id == span.context.span_id
    assert first.attributes["threadmill.task.outcome"] == "retried"
    assert first.status.status_code is StatusCode.ERROR
    [event] = first.events
    assert event.name == "exception" and event.attributes["exception.type"] == "ValueError"
    assert second.attributes["threadmill.task.outcome"] == "successful" and not second.events


def test_a_deferred_task_runs_in_a_trace_of_its_own_linked_to_its_enqueue(spans, backend):
    deferred = tasks.succeed.using(run_after=datetime.now(UTC) + timedelta(seconds=0.05))
    with trace.get_tracer("tests").start_as_current_span("request"):
        backend.enqueue(deferred, [], {})

    drain_with_retries(backend, attempts=2)  # once to find it deferred, once after the broker promoted it

    [send] = _named(spans, "send default")
    [run] = _named(spans, "process default")
    assert run.parent is None and run.context.trace_id != send.context.trace_id
    [link] = run.links
    assert link.context.span_id == send.context.span_id and link.context.trace_id == send.context.trace_id
    assert run.attributes["threadmill.task.outcome"] == "successful"


def test_a_final_failure_ends_its_span_failed(spans, backend):
    backend.enqueue(tasks.fail, [], {})

    drain(backend)

    [run] = _named(spans, "process default")
    assert run.attributes["threadmill.task.outcome"] == "failed"
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "RuntimeError: this task always fails"


def test_enqueue_many_is_one_send_span_whose_context_every_task_stores(spans, backend):
    results = backend.enqueue_many(tasks.succeed, [([i], {}) for i in range(3)])

    [send] = _named(spans, "send default")
    assert send.attributes["messaging.batch.message_count"] == 3
    for result in results:
        stored = backend.get_result(result.id).trace_context
        assert stored["traceparent"] == _traceparent(send)


async def test_aenqueue_runs_in_a_send_span_and_stores_its_context(spans, backend):
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        result = await backend.aenqueue(echo, ["async"], {})

    [send] = _named(spans, "send default")
    assert send.parent.span_id == request.get_span_context().span_id
    stored = backend.get_result(result.id).trace_context
    assert stored["traceparent"] == _traceparent(send)


def test_a_payload_without_a_trace_context_reads_as_one_with_none():
    # What the previous release wrote, and what this one writes with no tracing installed.
    payload = codec.encode_new(echo, codec.new_task_id(), ["old"], {}, 1.0)

    result = codec.decode(payload.encode(), Segment.READY)

    assert "trace" not in json.loads(payload)
    assert result.trace_context is None and result.args == ["old"]
    assert "trace" not in json.loads(codec.encode_result(result))


def test_a_stored_trace_context_survives_a_retry_and_a_malformed_one_reads_as_none():
    carrier = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "a=1"}
    payload = codec.encode_new(echo, codec.new_task_id(), [], {}, 1.0, carrier)
    retried = codec.encode_result(codec.decode(payload.encode(), Segment.READY))
    assert codec.decode(retried.encode(), Segment.FAILED).trace_context == carrier

    malformed = json.loads(payload) | {"trace": ["not", "a", "mapping"]}
    assert codec.decode(json.dumps(malformed).encode(), Segment.READY).trace_context is None


@pytest.mark.slow
def test_the_previous_release_runs_a_task_that_carries_a_trace_context(spans, backend, previous_release):
    with trace.get_tracer("tests").start_as_current_span("request"):
        result = backend.enqueue(echo, ["traced"], {})
    assert backend.get_result(result.id).trace_context

    old = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "worker", "--exit-empty", "-w", "1"],
        cwd=previous_release, env=worker_env(), capture_output=True, text=True, timeout=DEADLINE_S, check=False,
    )  # fmt: skip

    assert old.returncode == 0, old.stderr[-2000:]
    finished = backend.get_result(result.id)
    assert finished.status == "SUCCESSFUL" and finished.return_value == "traced"
