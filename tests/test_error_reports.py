"""Django's error reports (the DEBUG page, the e-mails to ADMINS) show no REDIS_URL password with Threadmill's filter."""

from __future__ import annotations

import secrets
import sys

import pytest
from django.test import RequestFactory
from django.views.debug import ExceptionReporter, get_default_exception_reporter_filter

# Made at run time: the DEBUG page shows the source around each frame, this line among them.
PASSWORD = "pw-" + secrets.token_hex(6)
URL = f"redis://deploy:{PASSWORD}@10.0.0.7:6379/0"
FILTER = "threadmill.error_reports.RedactingReporterFilter"


def _fail_with_the_url_in_hand(url: str, params: dict) -> None:
    raise RuntimeError("the server could not be reached")


def _report(settings) -> tuple[str, str]:
    """Return the text and HTML reports of an error raised while a frame held the URL, with TASKS naming it.

    Every setting goes through pytest-django's `settings`: an override_settings around it would
    restore, on its way out, a snapshot that holds the fixture's own changes, and leak them.
    """
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": URL}}
    get_default_exception_reporter_filter.cache_clear()  # Django keeps the first filter it made
    request = RequestFactory().get("/threadmill/")
    try:
        _fail_with_the_url_in_hand(URL, {"REDIS_URL": URL, "password": PASSWORD, "nested": [{"url": URL}]})
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
        return reporter.get_traceback_text(), reporter.get_traceback_html()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("debug", [True, False], ids=["debug page", "admins e-mail"])
def test_the_error_report_redacts_the_url_in_settings_and_in_frame_variables(settings, debug):
    settings.DEFAULT_EXCEPTION_REPORTER_FILTER, settings.DEBUG = FILTER, debug
    text, html = _report(settings)
    assert PASSWORD not in text and PASSWORD not in html
    assert "redis://deploy:***@10.0.0.7:6379/0" in text  # the address is still there to read
    assert "the server could not be reached" in text


def test_django_s_own_filter_shows_the_password_which_is_why_the_filter_exists(settings):
    settings.DEFAULT_EXCEPTION_REPORTER_FILTER = "django.views.debug.SafeExceptionReporterFilter"
    settings.DEBUG = True
    text, _ = _report(settings)
    assert PASSWORD in text


def test_the_demo_site_uses_the_filter():
    from inspector.site import settings as site

    assert site.DEFAULT_EXCEPTION_REPORTER_FILTER == FILTER
