"""A worker process's record of what its running tasks report, and the fetcher's turns that write it.

Consumers record each task's latest progress and metadata here (through `threadmill.progress`)
under a lock of their own; the fetcher takes what changed in its turns (`due`, then
`written`), as `threadmill.progress` describes: at most one write per task every
`REPORT_INTERVAL_S`, and a last one in the turn that ends the task's attempt.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from ..progress import METADATA_LIMIT_BYTES, TaskProgress, encode_metadata, encode_progress, metadata_of

logger = logging.getLogger("threadmill.worker")

#: Shortest time between two writes of one task's reports, seconds: at most two a second.
REPORT_INTERVAL_S = 0.5


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
            progress_text = encode_progress(progress)
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
