"""Django error reports without server secrets: an exception reporter filter that redacts every URL it shows.

Django's own filter hides settings whose name looks secret (`PASSWORD`, `KEY`, ...), but not
`TASKS["default"]["REDIS_URL"]`, and it shows every frame's local variables as they are; so
the DEBUG page, and in production the error e-mails to `ADMINS`, printed the password of a
REDIS_URL. Set `DEFAULT_EXCEPTION_REPORTER_FILTER = "threadmill.error_reports.RedactingReporterFilter"`:
on top of Django's filter, it passes every string of a setting or a frame variable through
`redact_text` and hides a frame variable or dict entry whose name looks secret. Nothing imports
this module but Django's error reporting, so it costs a task nothing.
"""

from __future__ import annotations

from typing import Any

from django.views.debug import SafeExceptionReporterFilter

from .redaction import redact_text

#: How deep a frame variable's containers are searched for strings to redact.
MAX_DEPTH = 6


class RedactingReporterFilter(SafeExceptionReporterFilter):
    """Django's SafeExceptionReporterFilter, plus: no URL's password and no secret-named value in a setting or frame variable."""

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        return redact_text(cleansed) if isinstance(cleansed, str) else cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        return [
            (name, self._cleanse(name, value, 0))
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]

    def _cleanse(self, name: Any, value: Any, depth: int) -> Any:
        if isinstance(name, str) and self.hidden_settings.search(name):
            return self.cleansed_substitute
        if isinstance(value, str):
            return redact_text(value)
        if depth >= MAX_DEPTH:
            return value
        if isinstance(value, dict):
            return {k: self._cleanse(k, v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return (
                type(value)(self._cleanse("", v, depth + 1) for v in value) if type(value) in (list, tuple) else value
            )
        return value
