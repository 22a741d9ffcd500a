"""Schedules (periodic tasks) as the console shows them: each backend's entries, their state, pause and run now."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..schedules import Schedule
from .queues import backend_aliases, get_backend


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule of one backend: its settings, its next tick and what Redis says of its last run."""

    alias: str
    schedule: Schedule
    next_run: datetime
    last_tick: datetime | None
    last_task: str | None
    last_enqueued_at: datetime | None
    paused: dict[str, Any] | None

    @property
    def paused_since(self) -> datetime | None:
        since = (self.paused or {}).get("since")
        return datetime.fromtimestamp(since, UTC) if isinstance(since, int | float) else None


def schedules() -> list[ScheduleRow]:
    """Return every schedule of every threadmill backend, in settings order."""
    rows = []
    for alias in backend_aliases():
        backend = get_backend(alias)
        if not backend.schedules:
            continue
        now, states = backend.server_time(), backend.schedule_states()
        for schedule in backend.schedules:
            state = states.get(schedule.name, {})
            last = (state.get("last_tick"), state.get("last_task"), state.get("last_enqueued_at"))
            rows.append(ScheduleRow(alias, schedule, schedule.next_tick(now), *last, state.get("paused")))
    return rows


def find_schedule(alias: str, name: str) -> Schedule:
    """Return a backend's schedule by name; LookupError naming it when there is none."""
    for schedule in get_backend(alias).schedules:
        if schedule.name == name:
            return schedule
    raise LookupError(f"No schedule named {name!r} on backend {alias!r}.")


def pause_schedule(alias: str, name: str, *, by: str) -> bool:
    """Stop enqueueing a schedule's runs (stored in Redis); False when it was paused already."""
    return get_backend(alias).pause_schedule(find_schedule(alias, name).name, by=by)


def resume_schedule(alias: str, name: str) -> bool:
    """Enqueue a paused schedule's runs again from its next tick; False when it was not paused."""
    return get_backend(alias).resume_schedule(find_schedule(alias, name).name)


def run_schedule(alias: str, name: str):
    """Enqueue one run of a schedule now, recorded as its last run; return the task result."""
    return get_backend(alias).enqueue_scheduled(find_schedule(alias, name), None)
