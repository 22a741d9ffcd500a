"""The Workflows pages: every workflow newest first, filtered by state, and one workflow's graph by layers.

Read through `threadmill.api.workflows`: a list page is two round trips (a filtered one, two per
batch of records scanned); a workflow's page draws at most `api.workflows.GRAPH_PAGE` tasks and
reads only their states, so a 10,000-task workflow is paged, never drawn whole. An unfinished
workflow's graph and counts refresh by an htmx poll of their partial.
"""

from __future__ import annotations

from django.core.exceptions import BadRequest
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from threadmill import api

from .security import console_view
from .tables import PER_PAGE
from .views import _page_number, _partial

#: Seconds between refreshes of an unfinished workflow's page.
REFRESH_S = 2
#: The task states a workflow's page counts and colours, in the order it lists them.
TASK_STATES = ("WAITING", "READY", "RUNNING", "SUCCESSFUL", "FAILED", "UNREADABLE", "EXPIRED")


def _alias(data) -> str:
    """Return the backend a page asks for (`?backend=`), the first configured one by default; 400 for an unknown one."""
    aliases = api.backend_aliases()
    alias = data.get("backend", "") or (aliases[0] if aliases else "")
    if alias not in aliases:
        raise BadRequest(f"No threadmill backend is configured as {alias[:40]!r}.")
    return alias


def _state(data) -> str:
    state = data.get("state", "")
    if state and state not in api.workflows.WORKFLOW_STATES:
        states = ", ".join(api.workflows.WORKFLOW_STATES)
        raise BadRequest(f"The state filter is one of {states}, not {state[:20]!r}.")
    return state


@require_GET
@console_view
def workflow_list(request):
    alias, state, page = _alias(request.GET), _state(request.GET), _page_number(request)
    found = api.workflows.workflows(alias, state=state, first=(page - 1) * PER_PAGE, count=PER_PAGE)
    pages = max(1, -(-found.total // PER_PAGE))
    if page > pages:
        raise Http404(f"There is no page {page} of this list: it has {pages}.")
    context = {
        "active": "workflows", "found": found, "state": state, "states": api.workflows.WORKFLOW_STATES,
        "backend": alias, "backends": api.backend_aliases(), "page": page, "pages": pages,
    }  # fmt: skip
    return render(request, _partial(request, "inspector/workflow_list.html", "workflows-table"), context)


@require_GET
@console_view
def workflow_detail(request, workflow_id: str):
    alias = _alias(request.GET) if "backend" in request.GET else _where(workflow_id)
    try:
        graph = api.workflows.workflow(alias, workflow_id, page=_page_number(request))
    except api.TaskResultDoesNotExist as e:
        raise Http404(str(e)) from e
    context = {
        "active": "workflows", "backend": alias, "graph": graph, "summary": graph.summary,
        "state_counts": [(s, graph.states[s]) for s in TASK_STATES if s in graph.states],
        "refresh_s": REFRESH_S, "paged": graph.pages > 1, "graph_page": api.workflows.GRAPH_PAGE,
    }  # fmt: skip
    return render(request, _partial(request, "inspector/workflow_detail.html", "workflow-graph"), context)


def _where(workflow_id: str) -> str:
    alias = api.workflows.find_workflow(api.backend_aliases(), workflow_id)
    if alias is None:
        raise Http404(f"No workflow with id {workflow_id!r} is stored.")
    return alias
