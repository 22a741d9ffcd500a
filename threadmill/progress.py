"""What a running task reports about itself: `set_progress`, `set_metadata`, and the values a result carries.

Neither call talks to the server. Each checks its arguments, then records the latest values
in memory on the worker process's `TaskReports`, per task, under a lock of their own: a task
may call them thousands of times a second at the cost of a dictionary update. The fetcher
thread writes what changed to the task's hash in its own turns (`due`, then `written`): at
most one write per task every `threadmill.worker.reports.REPORT_INTERVAL_S`, and a last one in the turn that
acknowledges, retries or hands the task back, before that call, so the last values are kept.
A write is fenced by the lease token, so a copy whose lease was taken back writes nothing.

Metadata merges into what is stored. A worker does not read the stored metadata when it
leases a task (that would cost every task a field), so the first write of an attempt asks
the server to refuse if metadata is stored already and to return it; the fetcher merges the
attempt's values over it and writes the whole again in the same turn.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any, Protocol

#: Most bytes of metadata (its compact JSON, UTF-8) a task may store.
METADATA_LIMIT_BYTES = 64 * 1024
#: Most characters of a progress note.
NOTE_LIMIT_CHARS = 1000

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

#: The reports and the task result of the task this consumer thread runs now, or None.
running = threading.local()


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """How far a task says it is: `done` of `total` (None when unknown), with a short `note`."""

    done: int | float
    total: int | float | None = None
    note: str = ""


def set_progress(done: float, total: float | None = None, note: str = "") -> None:
    """Record how far the running task is; the worker stores it without holding the task up.

    Raises:
        TypeError: `done` or `total` is not a number, or `note` not a string.
        ValueError: a number is negative or not finite, `done` exceeds `total`, or `note` is too long.
        RuntimeError: called outside a task run by a Threadmill worker.
    """
    _check_number("done", done)
    if total is not None:
        _check_number("total", total)
        if done > total:
            raise ValueError(f"set_progress's done ({done!r}) must not exceed its total ({total!r}).")
    if not isinstance(note, str):
        raise TypeError(f"set_progress's note must be a string, not {type(note).__name__}.")
    if len(note) > NOTE_LIMIT_CHARS:
        raise ValueError(f"set_progress's note is {len(note):,} characters long; the limit is {NOTE_LIMIT_CHARS:,}.")
    reports, result = _running_task("set_progress")
    reports.set_progress(result, TaskProgress(done, total, note))


def set_metadata(**values: Any) -> None:
    """Merge `values` into the running task's metadata; the worker stores it without holding the task up.

    Raises:
        TypeError: a value is not JSON (a set, an object, NaN).
        ValueError: the merged metadata would take more than `METADATA_LIMIT_BYTES` as JSON.
        RuntimeError: called outside a task run by a Threadmill worker.
    """
    for name, value in values.items():
        try:
            _dumps(value)
        except (TypeError, ValueError, RecursionError) as e:
            raise TypeError(f"set_metadata's value for {name!r} is not JSON: {e}") from None
    reports, result = _running_task("set_metadata")
    reports.set_metadata(result, values)


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"set_progress's {name} must be a number, not {type(value).__name__}.")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"set_progress's {name} must be a finite number of at least 0, not {value!r}.")


class ReportSink(Protocol):
    """Where a worker process keeps its running tasks' latest reports (`threadmill.worker.reports.TaskReports`)."""

    def set_progress(self, result: Any, progress: TaskProgress) -> None: ...

    def set_metadata(self, result: Any, values: dict[str, Any]) -> None: ...


def _running_task(call: str) -> tuple[ReportSink, Any]:
    bound = getattr(running, "task", None)
    if bound is None:
        raise RuntimeError(
            f"{call}() was called outside a running task; call it from a task run by a Threadmill worker."
        )
    return bound


def encode_metadata(metadata: dict[str, Any]) -> str:
    """Return metadata as its stored JSON, raising ValueError when it is over `METADATA_LIMIT_BYTES`."""
    text = _dumps(metadata)
    size = len(text.encode())
    if size > METADATA_LIMIT_BYTES:
        raise ValueError(
            f"The task's metadata would take {size:,} bytes as JSON; the limit is {METADATA_LIMIT_BYTES:,}."
        )
    return text


def encode_progress(progress: TaskProgress) -> str:
    """Return a progress as its stored JSON."""
    return _dumps({"done": progress.done, "total": progress.total, "note": progress.note})


def progress_of(stored: bytes | None) -> TaskProgress | None:
    """Return a stored progress, None when none was stored or it cannot be read (it comes from the server)."""
    if not stored:
        return None
    try:
        doc = json.loads(stored)
        return TaskProgress(doc["done"], doc["total"], str(doc["note"]))
    except (ValueError, TypeError, KeyError):
        return None


def metadata_of(stored: bytes | str | None) -> dict[str, Any]:
    """Return stored metadata, empty when none was stored or it cannot be read."""
    if not stored:
        return {}
    try:
        doc = json.loads(stored)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
