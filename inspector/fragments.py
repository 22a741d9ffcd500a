"""The context of the live parts of the console, shared by the pages and the websocket."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from urllib.parse import urlencode

from django.http import QueryDict
from django.urls import NoReverseMatch, reverse

from threadmill import api

from .charts import queue_charts
from .converters import TaskIdConverter


def segment_url(alias: str, queue_name: str, segment: api.Segment) -> str | None:
    """Return a segment's console URL, or None for a queue name no URL can carry (one with a slash)."""
    return url_or_none("inspector:task_list", alias, queue_name, segment)


def url_or_none(name: str, *args) -> str | None:
    """Return a console URL, or None when an argument (a queue name with a slash) cannot be carried by one."""
    try:
        return reverse(name, args=args)
    except NoReverseMatch:
        return None


def sparkline_points(values: list[int], width: int = 120, height: int = 24) -> str:
    """Return an SVG polyline's points for a series, scaled to the box."""
    if not values:
        return ""
    top = max(values) or 1
    step = width / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values))


def overview_context(can_change: bool = False) -> dict:
    """Return what the overview's queue table shows; the pause, resume and limits controls only to who may use them."""
    summaries = api.overview()
    rows = [
        {
            "summary": s,
            "charts": queue_charts(s.alias, s.queue_name),
            "pause_url": url_or_none(
                "inspector:resume_queue" if s.paused else "inspector:pause_queue", s.alias, s.queue_name
            ),
            "limits_url": url_or_none("inspector:queue_limits", s.alias, s.queue_name),
            "counts": [
                (segment, s.counts[segment], segment_url(s.alias, s.queue_name, segment)) for segment in api.Segment
            ],
            "ingress_points": sparkline_points(s.ingress),
            "egress_points": sparkline_points(s.egress),
        }
        for s in summaries
    ]
    return {"queue_rows": rows, "servers": api.server_memory(), "segments": list(api.Segment), "can_change": can_change}


#: What the workers page shows while a command waits in Redis for the worker's supervisor to take it.
PENDING_STATES = {"quiet": "quieting", "stop": "stopping"}


def workers_context(can_change: bool = False) -> dict:
    """Return what the workers table shows: hosts, each with its worker processes and their controls."""
    now = time.time()
    pending = {alias: api.controls.pending_commands(alias) for alias in api.backend_aliases()}
    hosts: dict[str, list] = {}
    for worker in _workers(now):
        command = pending.get(worker.alias, {}).get(worker.name, {}).get("command")
        hosts.setdefault(worker.host, []).append(
            {
                "worker": worker, "uptime_s": worker.uptime_s(now), "seen_s_ago": max(0.0, now - worker.last_seen),
                "shown_state": shown_state(worker, command), "pending": command,
                "quiet_url": url_or_none("inspector:command_worker", worker.alias, worker.name, "quiet"),
                "stop_url": url_or_none("inspector:command_worker", worker.alias, worker.name, "stop"),
            }
        )  # fmt: skip
    live = sum(1 for workers in hosts.values() for w in workers if w["worker"].state == "live")
    context = {"hosts": sorted(hosts.items()), "live_workers": live, "can_change": can_change}
    return {**context, "warming_up": not api.hub().warmed_up(now)}


def _workers(now: float) -> list[api.WorkerSnapshot]:
    """Return the workers the hub heard, and, until it listened long enough, the live ones Redis knows of."""
    heard = {w.key: w for w in api.hub().workers(now)}
    if not api.hub().warmed_up(now):
        for worker in api.known_workers(now):
            heard.setdefault(worker.key, worker)
    return sorted(heard.values(), key=lambda w: (w.host, w.pid))


def shown_state(worker: api.WorkerSnapshot, command: str | None) -> str:
    """Return a worker's state as the page says it: a pending command's, else what the worker reported."""
    if worker.state != "live":
        return worker.state  # lost or stopped: a command waiting for it no longer matters
    if command in PENDING_STATES:
        return PENDING_STATES[command]
    return worker.reported if worker.reported in ("quiet", "stopping") else "live"


#: A segment page's baseline total as the websocket URL carries it: ASCII digits, bounded.
_TOTAL = re.compile(r"[0-9]{1,12}")
#: A task id as a task page's websocket URL carries it: the task page's converter's shape.
_TASK_ID = re.compile(TaskIdConverter.regex)


@dataclass(frozen=True, slots=True)
class SegmentWatch:
    """One open segment page: its segment, and the segment's total when the page was rendered."""

    alias: str
    queue_name: str
    segment: api.Segment
    total: int

    @classmethod
    def of(cls, query) -> SegmentWatch | None:
        """Return the watch a websocket's query asks for, or None when it names no known segment."""
        alias, queue_name, segment, total = (query.get(k, "") for k in ("backend", "queue", "segment", "total"))
        if alias not in api.backend_aliases() or segment not in api.Segment or not _TOTAL.fullmatch(total):
            return None
        if not api.has_queue(alias, queue_name):
            return None
        return cls(alias, queue_name, api.Segment(segment), int(total))

    def context(self) -> dict:
        """Return what the "N new tasks" notice says: how the segment's total moved since the page was rendered."""
        change = api.count_view(self.alias, self.queue_name, self.segment) - self.total
        return {
            "new_count": change,
            "gone_count": -change,
            "reload_url": segment_url(self.alias, self.queue_name, self.segment),
        }


def task_context(alias: str, task_id: str, can_change: bool = False) -> dict:
    """Return what a task's page shows; TaskResultDoesNotExist when it is not stored."""
    task = api.task(alias, task_id)
    unreadable = isinstance(task, api.UnreadableTask)
    queue_name = task.queue_name if unreadable else task.task.queue_name
    return {
        "backend": alias, "task": task, "can_change": can_change, "unreadable": unreadable,
        "timeline": None if unreadable else api.timeline_of(task), "attempts_kept": api.ATTEMPTS_KEPT,
        "live_lease": bool(api.live_in_selection(alias, queue_name, task.segment, [task_id])),
        "watch_query": urlencode({"view": "task", "backend": alias, "task": task_id}),
    }  # fmt: skip


def _watched(query, **patterns: re.Pattern) -> tuple[str, ...] | None:
    """Return a websocket query's backend alias then its fields named in `patterns`; None when one is unknown or bad."""
    alias, values = query.get("backend", ""), [query.get(name, "") for name in patterns]
    if alias not in api.backend_aliases() or not all(map(re.Pattern.fullmatch, patterns.values(), values)):
        return None
    return alias, *values


@dataclass(frozen=True, slots=True)
class TaskWatch:
    """One open task page: its backend alias and task id."""

    alias: str
    task_id: str

    @classmethod
    def of(cls, query) -> TaskWatch | None:
        """Return the watch a websocket's query asks for, or None when it names no known backend or a bad id."""
        checked = _watched(query, task=_TASK_ID)
        return None if checked is None else cls(*checked)


def progress_bars(alias: str, queue_name: str, task_ids) -> list:
    """Return (task id, progress) of the tasks of `task_ids` still running in one queue (one read each)."""
    bars = []
    for task_id in task_ids:
        try:
            task = api.task(alias, task_id)
        except api.TaskResultDoesNotExist:
            continue
        if not isinstance(task, api.UnreadableTask) and task.task.queue_name == queue_name:
            bars.append((task_id, task.progress))
    return bars


#: Seconds between the fallback polls of an unfinished workflow's page, while its websocket is not open.
REFRESH_S = 2
#: The task states a workflow's page counts and colours, in the order it lists them.
TASK_STATES = ("WAITING", "DEFERRED", "READY", "RUNNING", "SUCCESSFUL", "FAILED", "UNREADABLE", "EXPIRED")
#: A graph page's number as a workflow page's websocket URL carries it: ASCII digits, bounded.
_PAGE = re.compile(r"[1-9][0-9]{0,5}")


def workflow_context(alias: str, workflow_id: str, page: int, can_change: bool, query: QueryDict) -> dict:
    """Return what a workflow's page shows of graph page `page`; `query` is what its page links start from.

    Raises TaskResultDoesNotExist when the workflow is not stored.
    """
    graph = api.workflows.workflow(alias, workflow_id, page=page)
    return {
        "active": "workflows", "backend": alias, "graph": graph, "summary": graph.summary, "query": query,
        "can_change": can_change,
        "state_counts": [(s, graph.states[s]) for s in TASK_STATES if s in graph.states],
        "refresh_s": REFRESH_S, "paged": graph.pages > 1, "graph_page": api.workflows.GRAPH_PAGE,
        "watch_query": urlencode({"view": "workflow", "backend": alias, "workflow": workflow_id, "page": graph.page}),
    }  # fmt: skip


@dataclass(frozen=True, slots=True)
class WorkflowWatch:
    """One open workflow page: its backend alias, workflow id and graph page."""

    alias: str
    workflow_id: str
    page: int

    @classmethod
    def of(cls, query) -> WorkflowWatch | None:
        """Return the watch a websocket's query asks for, or None when it names no known backend, a bad id or page."""
        checked = _watched(query, workflow=_TASK_ID, page=_PAGE)
        return None if checked is None else cls(checked[0], checked[1], int(checked[2]))

    def query(self) -> QueryDict:
        """Return the query string the page's links start from: its backend and graph page."""
        return QueryDict(urlencode({"backend": self.alias, "page": self.page}))


@dataclass(frozen=True, slots=True)
class WorkflowListWatch:
    """One open, unfiltered Workflows list: its backend alias and page (a filtered one scans records, so is not live)."""

    alias: str
    page: int

    @classmethod
    def of(cls, query) -> WorkflowListWatch | None:
        """Return the watch a websocket's query asks for, or None when it names no known backend or a bad page."""
        checked = _watched(query, page=_PAGE)
        return None if checked is None else cls(checked[0], int(checked[1]))

    def found(self, per_page: int) -> api.workflows.WorkflowList:
        """Return the page's workflows newest first, as the page reads them (two round trips)."""
        return api.workflows.workflows(self.alias, first=(self.page - 1) * per_page, count=per_page)
