"""The demo site's logging: the demo's deliberately failing tasks log one line each, not a traceback.

`threadmill run` enqueues tasks that fail on purpose (see `inspector.demo`), so a newcomer's
first screen was their tracebacks. Django logs a failed task at ERROR with the exception; for a
task of the demo this filter keeps that line and puts the exception's one-line form in it. The
console's task page still shows the whole traceback. Any other task logs as Django logs it.
"""

from __future__ import annotations

import logging
import traceback

#: The module path of the demo's tasks.
DEMO_TASKS = "inspector.demo."


class DemoFailuresOnOneLine(logging.Filter):
    """Let a record through; a demo task's failure loses its traceback and names its exception instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and f"path={DEMO_TASKS}" in record.getMessage():
            error = "".join(traceback.format_exception_only(record.exc_info[1])).strip()
            record.msg, record.args = f"{record.getMessage()}: {error} (expected: a demo task)", ()
            record.exc_info, record.exc_text = None, None
        return True
