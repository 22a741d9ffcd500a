"""The backend's half of the tooling API (`threadmill.api`), one mixin per concern, composed here.

Each concern of `threadmill.api` has its backend half in the module of the same name:
`queues` (queue names, pages, one task), `actions` (requeue, delete, purge, cancel), `workers`
(heartbeats), `controls` (paused queues, runtime limits, worker commands), `schedules`, `history`
(per-minute series), `metrics` (counts and counters) and `workflows` (records by enqueue time,
a workflow with its graph, task states); `host` declares what they use of the backend.
`RedisTooling` is mixed into `RedisTaskBackend`; the console reaches it only
through `threadmill.api`. Reads take one round trip a page, whatever a segment's depth;
every write is one Lua script.
"""

from __future__ import annotations

from ..cancelling import CANCEL_ROUNDS
from .actions import DELETE_ROUNDS, REQUEUE_ROUNDS, ActionTooling, CancelOutcome
from .controls import WORKER_COMMANDS, ControlTooling, LimitState
from .history import HISTORY_MINUTES, HistoryTooling
from .metrics import MetricsTooling, TaskLimitState, TaskLimitTooling
from .queues import NEWEST_FIRST, QueueTooling
from .schedules import ScheduleTooling
from .workers import WorkerTooling
from .workflows import WorkflowTooling

__all__ = [
    "CANCEL_ROUNDS",
    "DELETE_ROUNDS",
    "HISTORY_MINUTES",
    "NEWEST_FIRST",
    "REQUEUE_ROUNDS",
    "WORKER_COMMANDS",
    "ActionTooling",
    "CancelOutcome",
    "ControlTooling",
    "HistoryTooling",
    "LimitState",
    "MetricsTooling",
    "QueueTooling",
    "RedisTooling",
    "ScheduleTooling",
    "TaskLimitState",
    "TaskLimitTooling",
    "WorkerTooling",
    "WorkflowTooling",
]


class RedisTooling(
    QueueTooling,
    ActionTooling,
    WorkerTooling,
    ControlTooling,
    ScheduleTooling,
    HistoryTooling,
    MetricsTooling,
    TaskLimitTooling,
    WorkflowTooling,
):
    """Every tooling call of the backend: paging, acting on tasks, worker heartbeats, controls, limits, schedules, counts, workflows."""
