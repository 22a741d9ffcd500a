"""Periodic tasks: `TASKS[alias]["SCHEDULE"]`, parsed once, and the pure decisions about their runs.

Each entry names a task, a cron expression (read in Django's `TIME_ZONE`) and the arguments
of each run. The broker enqueues a run when the latest tick at or before now is newer than
the last tick it enqueued; the check and the enqueue are one script call, so however many
brokers run, each tick is enqueued once. A schedule seen for the first time only records its
latest tick (nothing is enqueued for ticks before it existed), and after an outage only the
latest missed tick is enqueued, once, not one run per missed tick. An edited cron or zone is
a new schedule (the guard compares them with the ones recorded beside the last tick).

Ticks are instants: on a fall-back night the two passes of the repeated hour are different
ticks of `*/15 * * * *`. They are returned in the schedule's zone with `fold` set, and compared
in UTC, since two aware datetimes of one zone compare by wall clock and ignore `fold`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from cronsim import CronSim, CronSimError
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

#: A schedule name: it becomes part of Redis hash fields and console URLs.
SCHEDULE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
#: The keys an entry of `SCHEDULE` may have.
ENTRY_KEYS = frozenset({"task", "cron", "args", "kwargs"})


@dataclass(frozen=True, slots=True)
class Schedule:
    """One periodic task: run `task_path` with `args`/`kwargs` at every tick of `cron` in `timezone`."""

    name: str
    task_path: str
    cron: str
    timezone: tzinfo
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def timing(self) -> str:
        """Return the cron expression and time zone as stored beside the last tick, to recognise an edit."""
        return f"{' '.join(self.cron.upper().split())} {getattr(self.timezone, 'key', None) or self.timezone}"

    def latest_tick(self, now: datetime) -> datetime:
        """Return the latest tick at or before `now`, in the schedule's zone."""
        now = now.astimezone(UTC).replace(microsecond=0)
        # cronsim's reverse walk starts strictly before its start, so one second on includes now. The
        # second is added in UTC: added to a local time it would drop `fold` and, on a fall-back night,
        # land an hour early, in the first pass of the repeated hour.
        walk = CronSim(self.cron, (now + timedelta(seconds=1)).astimezone(self.timezone), reverse=True)
        tick = next(tick for tick in walk if _utc(tick) <= now)
        # A fixed-time entry is walked on the wall clock (cronsim mimics Debian cron), which cannot tell the
        # two passes apart either: the forward walk is what defines the ticks, so take any it has before now.
        for later in self._ticks_after(tick):
            if _utc(later) > now:
                return tick
            tick = later
        return tick

    def next_tick(self, now: datetime) -> datetime:
        """Return the first tick after `now`, in the schedule's zone."""
        return next(self._ticks_after(now))

    def _ticks_after(self, start: datetime) -> Iterator[datetime]:
        # Aware datetimes of one zone compare by wall clock, ignoring `fold`: compare in UTC.
        after = _utc(start)
        for tick in CronSim(self.cron, start.astimezone(self.timezone)):
            if _utc(tick) > after:
                after = _utc(tick)
                yield tick.astimezone(self.timezone)

    def task(self):
        """Return the task this schedule runs; ImproperlyConfigured naming the entry when it cannot be found."""
        try:
            task = import_string(self.task_path)
        except ImportError as e:
            raise ImproperlyConfigured(
                f"SCHEDULE entry {self.name!r}: cannot import task {self.task_path!r}: {e}"
            ) from e
        if not hasattr(task, "enqueue"):
            raise ImproperlyConfigured(f"SCHEDULE entry {self.name!r}: {self.task_path!r} is not a task (use @task).")
        return task


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def parse_schedules(alias: str, raw: Any, timezone: tzinfo) -> tuple[Schedule, ...]:
    """Return the `SCHEDULE` setting of `alias` as Schedules; ImproperlyConfigured names any bad entry."""
    if raw is None:
        return ()
    where = f"TASKS[{alias!r}]['SCHEDULE']"
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of name -> entry, not {type(raw).__name__}.")
    return tuple(_entry(where, name, entry, timezone) for name, entry in raw.items())


def _entry(where: str, name: Any, entry: Any, timezone: tzinfo) -> Schedule:
    if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
        raise ImproperlyConfigured(f"{where} entry name {name!r} must be 1-100 letters, digits, '_', '.' or '-'.")
    here = f"{where}[{name!r}]"
    if not isinstance(entry, Mapping):
        raise ImproperlyConfigured(f"{here} must be a dict with 'task' and 'cron'.")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"{here} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(ENTRY_KEYS))}."
        )
    task_path, cron = entry.get("task"), entry.get("cron")
    if not isinstance(task_path, str) or not task_path:
        raise ImproperlyConfigured(f"{here}['task'] must be the dotted path of a task.")
    if not isinstance(cron, str):
        raise ImproperlyConfigured(f"{here}['cron'] must be a cron expression such as '0 3 * * *'.")
    try:
        CronSim(cron, datetime.now(timezone))
    except CronSimError as e:
        raise ImproperlyConfigured(f"{here}['cron'] {cron!r} is not a valid cron expression: {e}.") from None
    args, kwargs = entry.get("args", []), entry.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise ImproperlyConfigured(f"{here}: 'args' must be a list and 'kwargs' a dict.")
    return Schedule(name, task_path, cron, timezone, list(args), dict(kwargs))
