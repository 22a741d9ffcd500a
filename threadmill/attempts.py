"""A task's attempt records: who ran each attempt, when it was leased, started and ended, and how.

The scripts that end an attempt (acknowledge, requeue) append its record to the task hash's
`attempts` field in the call they already make: one JSON array a line, oldest first, the last
`ATTEMPTS_KEPT` kept (`lua/lib/attempts.lua`). The field lives in the task hash, so it expires
and is deleted with the task. Times are the server's clock: the lease time is the server's, and
the worker adds the monotonic seconds from its acquire call to the run's start and end, so a
worker's wall clock never skews them. A task leased and handed back unstarted (prefetched, then
released) records nothing; a task run by an older release has no records for those attempts.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.tasks import TaskResultStatus

from .base import Attempt, ThreadmillTaskResult
from .exceptions import TaskCancelled, TaskTimeout
from .outcome import ended_by

#: Attempt records a task keeps, the newest; `lua/lib/attempts.lua` holds the same number.
ATTEMPTS_KEPT = 20
#: Longest error line an attempt record keeps, characters (the full traceback is in `errors`).
ERROR_CHARS = 300

#: The outcome of an attempt a time limit or an abort ended.
_ENDED_BY: dict[type[BaseException] | None, str] = {TaskTimeout: "timed out", TaskCancelled: "cancelled"}

# Built once: json.dumps with options builds an encoder a call, a cost on every acknowledgement.
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _error_line(result: ThreadmillTaskResult) -> str:
    if not result.errors:
        return ""
    lines = result.errors[-1].traceback.strip().splitlines()
    line = lines[-1] if lines else result.errors[-1].exception_class_path
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"


def attempt_record(result: ThreadmillTaskResult) -> str:
    """Return the record of the attempt that ends with `result` (its lease applied); "" when it held no lease.

    A run the worker timed (`result.ran`) ends "successful" or "failed"; a lease that ended
    without one (the reaper's, a lost worker's, one interrupted at shutdown) ends "abandoned";
    one a time limit or an abort ended, "timed out" or "cancelled".
    """
    if not result.lease_worker or result.lease_started_at is None:
        return ""
    ran = result.ran
    if ran is not None and result.status == TaskResultStatus.SUCCESSFUL:
        # The common case, on every acknowledgement: spliced from JSON parts.
        return f'{_lease_json(result.lease_worker, result.lease_started_at)}{ran[0]!r},{ran[1]!r},"successful",""]'
    leased = result.lease_started_at.timestamp()
    started, ended = (None, None) if ran is None else ran
    outcome = _ENDED_BY.get(ended_by(result)) or ("abandoned" if ran is None else "failed")
    return _dumps([result.lease_worker, leased, started, ended, outcome, _error_line(result)])


#: The last lease `_lease_json` encoded: (worker, lease start, its record's opening).
_last_lease: tuple[str, datetime, str] = ("", datetime.min, "")


def _lease_json(worker: str, leased_at: datetime) -> str:
    """Return a record's opening, `[worker,lease start,`: an acquire's leases share it, so it is encoded once a batch."""
    global _last_lease
    last = _last_lease
    if last[1] is leased_at and last[0] == worker:
        return last[2]
    opening = f"[{_worker_json(worker)},{leased_at.timestamp()!r},"
    _last_lease = (worker, leased_at, opening)
    return opening


@functools.lru_cache(maxsize=64)
def _worker_json(worker: str) -> str:
    return _dumps(worker)


def _moment(value) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _attempt(line: str) -> Attempt | None:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, list) or len(record) < 6:
        return None
    worker, leased, started, ended, outcome, error = record[:6]
    if not all(isinstance(text, str) for text in (worker, outcome, error)):
        return None
    return Attempt(worker, _moment(leased), _moment(started), _moment(ended), outcome, error)


def attempts_of(stored: bytes | str | None) -> tuple[Attempt, ...]:
    """Read a task's `attempts` field, oldest first; a line this code cannot read is left out."""
    if not stored:
        return ()
    text = stored.decode(errors="replace") if isinstance(stored, bytes) else stored
    return tuple(attempt for line in text.split("\n") if (attempt := _attempt(line)) is not None)


@dataclass(frozen=True, slots=True)
class Timeline:
    """A task's attempts, oldest first, and how long it waited for its first run (None: not known yet).

    `waited_until` says what the wait ends at: "start" (the executor's start, recorded), or
    "lease" (the first lease, for a task whose first attempt has no record).
    """

    attempts: tuple[Attempt, ...]
    waited: timedelta | None
    waited_until: str


def timeline_of(result: ThreadmillTaskResult) -> Timeline:
    """Return the timeline of `result`: its records, its attempt going on, and its older unrecorded ones.

    An attempt with no record (run by an older release, or beyond the last `ATTEMPTS_KEPT`)
    shows its worker alone, "not recorded"; the attempt going on shows its lease, "running".
    """
    recorded = result.attempt_records
    running = bool(result.lease_worker) and result.status == TaskResultStatus.RUNNING
    current = (Attempt(result.lease_worker, result.lease_started_at, None, None, "running"),) if running else ()
    missing = max(0, len(result.worker_ids) - len(recorded) - len(current))
    unrecorded = tuple(Attempt(worker, None, None, None, "not recorded") for worker in result.worker_ids[:missing])
    attempts = unrecorded + recorded + current
    first = attempts[0] if attempts else None
    if first is not None and first.started_at is not None and result.enqueued_at is not None:
        return Timeline(attempts, first.started_at - result.enqueued_at, "start")
    if result.started_at is not None and result.enqueued_at is not None:
        return Timeline(attempts, result.started_at - result.enqueued_at, "lease")
    return Timeline(attempts, None, "")
