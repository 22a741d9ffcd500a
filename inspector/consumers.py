"""Live updates: one websocket per console tab, fed by the process's one telemetry subscription.

The hub's thread only flags "something changed"; each connection renders at most
`MAX_UPDATES_PER_S` times a second (coalescing bursts), and not at all while its tab says
it is hidden. What is sent is server-rendered HTML the htmx ws extension swaps in by id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple
from urllib.parse import urlencode

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict
from django.template.loader import render_to_string

from threadmill import api

from .fragments import (
    SegmentWatch,
    TaskWatch,
    WorkflowListWatch,
    WorkflowWatch,
    overview_context,
    progress_bars,
    task_context,
    workers_context,
    workflow_context,
)
from .security import can_change
from .tables import PER_PAGE
from .templatetags.inspector import progress_bar

logger = logging.getLogger("inspector.live")

#: Most updates a connection receives per second; bursts of telemetry are coalesced.
MAX_UPDATES_PER_S = 4
#: Close code for a user who may not see the console (4000 + HTTP 403).
CLOSE_FORBIDDEN = 4403

#: Which fragments each page subscribes to, and the partial that renders each.
FRAGMENTS = {
    "overview": ("inspector/queue_list.html#queues-table", overview_context, {"queues", "tick"}),
    "workers": ("inspector/worker_list.html#workers-table", workers_context, {"workers", "tick"}),
}


_rendered: dict[tuple[str, bool], tuple[int, str]] = {}


def render_fragment(view: str, can_change: bool = False) -> str:
    """Render one page's live fragment, marked for an out-of-band swap, with controls only for who may use them.

    Tabs of this process that update after the same telemetry event share one render. The
    controls' forms carry no CSRF token here (no request): htmx sends it in a header.
    """
    generation = api.hub().generation
    cached = _rendered.get((view, can_change))
    if cached and cached[0] == generation:
        return cached[1]
    template_name, context, _ = FRAGMENTS[view]
    html = render_to_string(template_name, {**context(can_change), "oob": True})
    _rendered[(view, can_change)] = (generation, html)
    return html


#: A segment page's notice: which changes re-render it, and its partial.
SEGMENT_KINDS = {"queues", "tick"}
SEGMENT_NOTICE = "inspector/task_list.html#new-tasks"


def render_segment_notice(watch: SegmentWatch, progressed: Sequence[str] = ()) -> str:
    """Render a segment page's "N new tasks" notice for an out-of-band swap (per page: its baseline is its own).

    A running page also gets the progress bars of the tasks of `progressed` that run in its
    queue; a bar whose row the page does not show is ignored by htmx.
    """
    html = render_to_string(SEGMENT_NOTICE, {**watch.context(), "oob": True})
    if not progressed:
        return html
    bars = progress_bars(watch.alias, watch.queue_name, progressed[:MAX_PROGRESS_BARS])
    return html + "".join(progress_bar(task_id, progress, oob=True) for task_id, progress in bars)


#: A task page's live part: its status, progress, timeline and metadata.
TASK_STATUS = "inspector/task_detail.html#task-status"
#: Which changes re-render a task page, besides progress its task reported.
TASK_KINDS = {"queues"}
#: Most progress bars one update of a running page carries (a page shows 50 rows).
MAX_PROGRESS_BARS = 50


def render_task_status(watch: TaskWatch, allowed: bool) -> str:
    """Render a task page's status partial for an out-of-band swap; "" once the task is gone."""
    try:
        context = task_context(watch.alias, watch.task_id, allowed)
    except api.TaskResultDoesNotExist:
        return ""
    return render_to_string(TASK_STATUS, {**context, "oob": True})


#: A workflow page's live part: its actions, facts, counts and graph.
WORKFLOW_GRAPH = "inspector/workflow_detail.html#workflow-graph"
#: Which changes may move a workflow's counts: a task of any backend acknowledged, or the hub's tick
#: (the reaper, a cancel or a retry publish nothing a page would otherwise hear).
WORKFLOW_KINDS = {"queues", "tick"}


class WorkflowFollower:
    """Renders a workflow page's graph when its record's counts moved since the last render, until it is final.

    Each call reads the counts (one HMGET); only a change costs the graph's two round trips and
    a render. The acquire of a READY task counts nothing, so a node turns RUNNING on the page at
    the next count change, not when it starts. Called from one thread at a time (the pump's).
    """

    def __init__(self, watch: WorkflowWatch, allowed: bool) -> None:
        self.watch, self.allowed = watch, allowed
        self.seen: api.workflows.WorkflowSummary | None = None
        #: Whether the last render showed the workflow final (or gone): nothing more will be pushed.
        self.finished = False

    def __call__(self) -> str:
        """Return the graph partial for an out-of-band swap, "" when nothing changed or the workflow is gone."""
        watch = self.watch
        summary = api.workflows.workflow_summary(watch.alias, watch.workflow_id)
        if summary == self.seen:
            return ""
        try:
            context = workflow_context(watch.alias, watch.workflow_id, watch.page, self.allowed, watch.query())
        except api.TaskResultDoesNotExist:
            self.finished = True
            return ""
        # The counts the render read, which may be newer than the HMGET's.
        self.seen, self.finished = context["summary"], context["summary"].state != "running"
        return render_to_string(WORKFLOW_GRAPH, {**context, "oob": True})


#: The Workflows list's live part: its total, rows and pages.
WORKFLOWS_TABLE = "inspector/workflow_list.html#workflows-table"


class WorkflowListFollower:
    """Renders an unfiltered Workflows list when its page's workflows or their counts changed since the last render."""

    def __init__(self, watch: WorkflowListWatch) -> None:
        self.watch = watch
        self.seen: api.workflows.WorkflowList | None = None

    def __call__(self) -> str:
        """Return the list's table for an out-of-band swap, "" when nothing it shows changed (two round trips)."""
        found = self.watch.found(PER_PAGE)
        if found == self.seen:
            return ""
        self.seen, page = found, self.watch.page
        context = {
            "found": found, "state": "", "backend": self.watch.alias, "page": page, "oob": True,
            "pages": max(1, -(-found.total // PER_PAGE)), "query": QueryDict(urlencode({"backend": self.watch.alias})),
        }  # fmt: skip
        return render_to_string(WORKFLOWS_TABLE, context)


class Following(NamedTuple):
    """What one connection follows: the hub's kinds of change it renders on, its render, the progress it collects."""

    kinds: set[str] | frozenset[str]
    render: Callable[..., str]
    progressed: set[str] | None = None


async def _follow_segment(view: str, query: QueryDict, user) -> Following | None:
    watch = await database_sync_to_async(SegmentWatch.of)(query)
    if watch is None:
        return None
    # A RUNNING page collects the ids of the tasks that reported progress, to draw their bars.
    progressed: set[str] | None = set() if watch.segment is api.Segment.RUNNING else None
    return Following(SEGMENT_KINDS, partial(render_segment_notice, watch), progressed)


async def _follow_task(view: str, query: QueryDict, user) -> Following | None:
    watch, allowed = TaskWatch.of(query), await database_sync_to_async(can_change)(user)
    if watch is None:
        return None
    return Following(TASK_KINDS | {f"progress:{watch.task_id}"}, partial(render_task_status, watch, allowed))


async def _follow_workflow(view: str, query: QueryDict, user) -> Following | None:
    watch, allowed = WorkflowWatch.of(query), await database_sync_to_async(can_change)(user)
    return None if watch is None else Following(WORKFLOW_KINDS, WorkflowFollower(watch, allowed))


async def _follow_workflow_list(view: str, query: QueryDict, user) -> Following | None:
    watch = WorkflowListWatch.of(query)
    return None if watch is None else Following(WORKFLOW_KINDS, WorkflowListFollower(watch))


async def _follow_fragment(view: str, query: QueryDict, user) -> Following | None:
    """The overview's and the workers page's fragments; None for any other view (an unknown one)."""
    if view not in FRAGMENTS:
        return None
    allowed = await database_sync_to_async(can_change)(user)
    return Following(FRAGMENTS[view][2], partial(render_fragment, view, allowed))


#: How a connection follows each page kind but the fragments (`_follow_fragment`).
_FOLLOWERS = {
    "segment": _follow_segment,
    "task": _follow_task,
    "workflow": _follow_workflow,
    "workflows": _follow_workflow_list,
}


class ConsoleConsumer(AsyncWebsocketConsumer):
    """Pushes a page's live fragment whenever telemetry says it changed, coalesced and paused when hidden."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        # QueryDict decodes any bytes (a hostile query string is not always UTF-8).
        query = QueryDict(self.scope.get("query_string", b""))
        self.view = query.get("view", "overview")
        follow = _FOLLOWERS.get(self.view, _follow_fragment)
        following = await follow(self.view, query, user)
        if following is None:
            await self.close(code=4400)
            return
        self.kinds, self.render, self.progressed = following
        self.visible = True
        self.changed = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        api.hub().subscribe(self._on_telemetry)
        self.changed.set()
        self.pump = asyncio.create_task(self._pump())

    def _on_telemetry(self, kind: str) -> None:
        # Called on the hub's thread: hand the news to this connection's loop, nothing more.
        if kind in self.kinds:
            self.loop.call_soon_threadsafe(self.changed.set)
        elif self.progressed is not None and kind.startswith("progress:"):
            self.loop.call_soon_threadsafe(self._progressed, kind[len("progress:") :])

    def _progressed(self, task_id: str) -> None:
        if self.progressed is not None and len(self.progressed) < MAX_PROGRESS_BARS:
            self.progressed.add(task_id)
        self.changed.set()

    async def _pump(self) -> None:
        interval = 1 / MAX_UPDATES_PER_S
        while True:
            await self.changed.wait()
            self.changed.clear()
            if not self.visible:
                continue
            try:
                render = self.render
                if self.progressed:
                    # Taken on this loop, where the hub's news lands: the render's thread gets a list of its own.
                    render, self.progressed = partial(render, progressed=list(self.progressed)), set()
                html = await database_sync_to_async(render)()
                if html:
                    await self.send(text_data=html)
                if getattr(render, "finished", False):
                    api.hub().unsubscribe(self._on_telemetry)  # a final workflow changes no more
                    return
            except Exception:
                logger.exception("Rendering the %s fragment failed.", self.view)
            await asyncio.sleep(interval)  # the rate limit: later changes coalesce into one update

    async def receive(self, text_data=None, bytes_data=None) -> None:
        try:
            message = json.loads(text_data or "{}")
        except (ValueError, RecursionError):  # deep nesting exhausts the parser's recursion limit
            return
        if isinstance(message, dict) and "visible" in message:
            self.visible = bool(message["visible"])
            if self.visible:
                self.changed.set()

    async def disconnect(self, code) -> None:
        if hasattr(self, "pump"):
            api.hub().unsubscribe(self._on_telemetry)
            self.pump.cancel()
