"""The console shows a data layout this code does not know as a 503 page naming it, never a traceback."""

from __future__ import annotations

import pytest
from django.tasks import task_backends

from tests.layouts import refusal, stamp_layout


@pytest.mark.parametrize("url", ["/threadmill/", "/threadmill/default/default/ready/"])
def test_the_console_shows_an_unknown_layout_as_a_503_page_naming_it(operator_client, settings, redis_url, url):
    stamp_layout(redis_url, "99")
    settings.TASKS = {"default": dict(settings.TASKS["default"])}  # a new backend instance, as in a new process
    assert not task_backends["default"]._layout_checked
    response = operator_client.get(url)
    assert response.status_code == 503
    html = response.content.decode()
    assert "Unknown data layout" in html
    assert "has layout version 99, and this Threadmill knows layouts up to 3" in html
    assert "Traceback" not in html


def test_metrics_refuse_an_unknown_layout_with_a_503(operator_client, settings, redis_url):
    stamp_layout(redis_url, "99")
    settings.TASKS = {"default": dict(settings.TASKS["default"])}
    response = operator_client.get("/threadmill/metrics")
    assert response.status_code == 503
    assert response.content.decode() == refusal("99") + "\n"


def test_the_telemetry_hub_warns_once_about_a_refused_layout_and_backs_off(settings, redis_url, caplog):
    import time

    from threadmill.api import workers

    stamp_layout(redis_url, "99")
    settings.TASKS = {"default": dict(settings.TASKS["default"])}
    hub = workers.TelemetryHub()
    with caplog.at_level("DEBUG", logger="threadmill"):
        hub.start()
        try:
            deadline = time.monotonic() + 10
            while hub.losses < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            hub.stop()
    assert hub.losses >= 2
    lost = [r for r in caplog.records if r.getMessage().startswith("Telemetry subscription lost")]
    assert [r.levelname for r in lost][:2] == ["WARNING", "DEBUG"]
    assert "has layout version 99" in lost[0].getMessage()
    assert "retrying in 1 s" in lost[0].getMessage() and "retrying in 2 s" in lost[1].getMessage()
