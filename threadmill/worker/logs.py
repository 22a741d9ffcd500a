"""Log formatting for the worker: one JSON object per line, or plain text.

A record carries the process, the thread and, while a consumer thread runs a task, that
task's id and path. The task is tracked per thread by `running_task`, which the executor
sets around each task, so log calls inside task code are tagged without any setup.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any

#: Log formats `--log-format` accepts.
LOG_FORMATS = ("json", "text")

#: The task each consumer thread is running now: `running_task.id` and `.task`, None between tasks.
running_task = threading.local()

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d %(threadName)s%(task)s] %(message)s"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str).encode


def _task_of_thread() -> tuple[str | None, str | None]:
    task_id = getattr(running_task, "id", None)
    return (task_id, running_task.task.module_path) if task_id is not None else (None, None)


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: time, level, logger, message, process, thread, task."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        task_id, task_path = _task_of_thread()
        if task_id is not None:
            entry["task_id"] = task_id
            entry["task_path"] = task_path
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return _dumps(entry)


class TextFormatter(logging.Formatter):
    """Format a record as one readable line, its traceback below it."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        task_id, task_path = _task_of_thread()
        record.task = f" task {task_id} {task_path}" if task_id is not None else ""
        return super().format(record)


def configure(log_format: str, verbosity: int = 1) -> None:
    """Send every log record to stderr in `log_format`, at the level `verbosity` selects.

    Verbosity 0 logs warnings and errors, 1 adds the worker's own information, 2 adds
    Django's per-task lines (`django.tasks`), 3 adds debug records.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbosity >= 3 else logging.INFO if verbosity >= 1 else logging.WARNING)
    logging.getLogger("threadmill").setLevel(root.level)
    # Django logs every task start and finish at INFO; at thousands of tasks a second that
    # line costs more than an echo task, so it is opt-in. Failures still log at ERROR.
    if verbosity < 2:
        logging.getLogger("django.tasks").setLevel(logging.WARNING)
