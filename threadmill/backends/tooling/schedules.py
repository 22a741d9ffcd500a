"""The backend's half of `threadmill.api.schedules`: what Redis holds of each schedule, and its pause.

A schedule's settings come from `TASKS[alias]["SCHEDULE"]`; Redis holds, in one hash, its
last tick and task and who paused it. Enqueueing a run is the backend's `enqueue_scheduled`.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from .. import codec
from ..errors import translate_errors
from .host import ToolingHost


def _epoch(value: bytes | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


class ScheduleTooling(ToolingHost):
    """Reading each schedule's stored state, and pausing and resuming its runs."""

    @translate_errors
    def schedule_states(self) -> dict[str, dict[str, Any]]:
        """Return each schedule's stored state: last tick and task, when it was enqueued, and who paused it."""
        raw = {field.decode(): value for field, value in self.client.hgetall(self.keys.schedules()).items()}
        states: dict[str, dict[str, Any]] = {}
        for schedule in self.schedules:
            name = schedule.name
            paused = raw.get(f"{name}:paused")
            states[name] = {
                "last_tick": _epoch(raw.get(f"{name}:tick")),
                "last_task": codec.text(raw.get(f"{name}:task")) or None,
                "last_enqueued_at": _epoch(raw.get(f"{name}:enqueued_at")),
                "paused": None if paused is None else json.loads(paused),
            }
        return states

    @translate_errors
    def pause_schedule(self, name: str, *, by: str = "") -> bool:
        """Stop enqueueing a schedule's runs (stored in Redis, not settings); False when it was paused already."""
        document = json.dumps({"by": by, "since": time.time()})
        return bool(self.scripts.pause_schedule(f"{name}:paused", document))

    @translate_errors
    def resume_schedule(self, name: str) -> bool:
        """Enqueue a paused schedule's runs again, from its next tick; False when it was not paused."""
        return bool(self.client.hdel(self.keys.schedules(), f"{name}:paused"))
