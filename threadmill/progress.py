"""What a running task reports about itself: `set_progress`, `set_metadata`, and the values a result carries.

Neither call talks to the server. Each checks its arguments, then records the latest values
in memory on the worker process's `TaskReports`, per task, under a lock of their own: a task
may call them thousands of times a second at the cost of a dictionary update. The fetcher
thread writes what changed to the task's hash in its own turns (`due`, then `written`): at
most one write per task every `REPORT_INTERVAL_S`, and a last one in the turn that
acknowledges, retries or hands the task back, before that call, so the last values are kept.
A write is fenced by the lease token, so a copy whose lease was taken back writes nothing.

Metadata merges into what is stored. A worker does not read the stored metadata when it
leases a task (that would cost every task a field), so the first write of an attempt asks
the server to refuse if metadata is stored already and to return it; the fetcher merges the
attempt's values over it and writes the whole again in the same turn.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("threadmill.worker")

#: Most bytes of metadata (its compact JSON, UTF-8) a task may store.
METADATA_LIMIT_BYTES = 64 * 1024
#: Most characters of a progress note.
NOTE_LIMIT_CHARS = 1000
#: Shortest time between two writes of one task's reports, seconds: at most two a second.
REPORT_INTERVAL_S = 0.5

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


def _running_task(call: str) -> tuple[TaskReports, Any]:
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


@dataclass(slots=True)
class TaskReport:
    """One task run's latest reports, and which of them the fetcher has written."""

    task_id: str
    token: str
    progress: TaskProgress | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    metadata_text: str = ""
    progress_version: int = 0
    metadata_version: int = 0
    written_progress: int = 0
    written_metadata: int = 0
    #: Whether the metadata includes what was stored before this run (see the module docstring).
    merged: bool = False
    written_at: float = float("-inf")

    @property
    def dirty(self) -> bool:
        return self.progress_version != self.written_progress or self.metadata_version != self.written_metadata


@dataclass(frozen=True, slots=True)
class PendingReport:
    """A report the fetcher writes this turn: what the script takes, and the versions it covers."""

    report: TaskReport
    progress_text: str
    metadata_text: str
    progress_version: int
    metadata_version: int
    final: bool

    @property
    def entry(self) -> tuple[str, str, str, str, bool]:
        """What the backend's `report` takes: id, lease token, progress, metadata ("" leaves either) and merged."""
        r = self.report
        return (r.task_id, r.token, self.progress_text, self.metadata_text, r.merged)


class TaskReports:
    """The reports of the tasks a worker process runs, by lease token, between consumers and the fetcher."""

    def __init__(self, interval_s: float = REPORT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._reports: dict[str, TaskReport] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._reports)

    def _report(self, result: Any) -> TaskReport:
        report = self._reports.get(result.lease_token)
        if report is None:
            report = self._reports[result.lease_token] = TaskReport(result.id, result.lease_token)
        return report

    def set_progress(self, result: Any, progress: TaskProgress) -> None:
        """Record the latest progress of the task `result` runs."""
        with self._lock:
            report = self._report(result)
            report.progress = progress
            report.progress_version += 1

    def set_metadata(self, result: Any, values: dict[str, Any]) -> None:
        """Merge `values` into the run's metadata; ValueError, and nothing changed, when it would be too large."""
        with self._lock:
            report = self._report(result)
            merged = {**report.metadata, **values}
            report.metadata_text = encode_metadata(merged)
            report.metadata = merged
            report.metadata_version += 1

    def due(self, now: float, finishing: set[str]) -> list[PendingReport]:
        """Take the reports to write now: each changed one written `interval_s` ago or more, and `finishing` tokens'.

        A finishing task's report that has nothing left to write is forgotten here.
        """
        pending = []
        with self._lock:
            for token, report in list(self._reports.items()):
                final = token in finishing
                if not report.dirty:
                    if final:
                        del self._reports[token]
                    continue
                if final or now - report.written_at >= self.interval_s:
                    pending.append(self._pending(report, final))
        return pending

    @staticmethod
    def _pending(report: TaskReport, final: bool) -> PendingReport:
        progress = report.progress
        progress_text = ""
        if progress is not None and report.progress_version != report.written_progress:
            progress_text = _dumps({"done": progress.done, "total": progress.total, "note": progress.note})
        metadata_text = report.metadata_text if report.metadata_version != report.written_metadata else ""
        return PendingReport(
            report, progress_text, metadata_text, report.progress_version, report.metadata_version, final
        )

    def written(self, pending: list[PendingReport], replies: list[Any], now: float) -> list[PendingReport]:
        """Record what the server answered; return the reports to write again at once (their metadata merged).

        A reply is 1 (stored), 0 (the fence refused it: the lease is gone, nothing is retried) or
        the stored metadata the run's first write found, merged here under the run's own values.
        """
        again = []
        with self._lock:
            for item, reply in zip(pending, replies, strict=True):
                report = item.report
                report.written_at = now
                report.written_progress = item.progress_version
                if isinstance(reply, bytes | str):
                    self._merge_stored(report, reply)
                    again.append(self._pending(report, item.final))
                    continue
                report.merged = report.merged or bool(item.metadata_text)
                report.written_metadata = item.metadata_version
                if item.final and not report.dirty:
                    self._reports.pop(report.token, None)
        return again

    @staticmethod
    def _merge_stored(report: TaskReport, stored: bytes | str) -> None:
        merged = {**metadata_of(stored), **report.metadata}
        try:
            report.metadata_text = encode_metadata(merged)
            report.metadata = merged
        except ValueError:
            logger.warning(
                "Task %s: its metadata merged with what an earlier attempt stored would pass %d bytes; "
                "this attempt's values replace the earlier ones.",
                report.task_id,
                METADATA_LIMIT_BYTES,
            )
        report.merged = True
