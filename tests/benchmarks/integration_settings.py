"""Settings for the integrations benchmark: the test settings, plus the tool BENCH_INTEGRATION names set up.

"otel-sdk": the OpenTelemetry SDK samples every span and hands them in batches to an exporter
that drops them. "sentry" and "sentry-traced": sentry-sdk initialised with a transport that
drops every envelope, the second with every run traced (`traces_sample_rate` 1). Anything else sets nothing up. Nothing leaves the machine either way.
"""

import os

from tests.settings import *

_INTEGRATION = os.environ.get("BENCH_INTEGRATION", "")

if _INTEGRATION == "otel-sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class _Dropped(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(_provider)
elif _INTEGRATION in ("sentry", "sentry-traced"):
    import sentry_sdk
    from sentry_sdk.transport import Transport

    class _Dropped(Transport):
        def capture_envelope(self, envelope):
            pass

    sentry_sdk.init(
        dsn="https://key@sentry.invalid/1", transport=_Dropped(), auto_enabling_integrations=False,
        traces_sample_rate=1.0 if _INTEGRATION == "sentry-traced" else None,
    )  # fmt: skip
