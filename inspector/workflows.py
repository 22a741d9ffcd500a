"""The Workflows pages: every workflow newest first, filtered by state, and one workflow's graph by layers.

Read through `threadmill.api.workflows`: a list page is two round trips (a filtered one, two per
batch of records scanned); a workflow's page draws at most `api.workflows.GRAPH_PAGE` tasks and
reads only their states, so a 10,000-task workflow is paged, never drawn whole. An unfinished
workflow's graph, counts and actions are pushed over the console's websocket when its record's
counts change (`consumers.WorkflowFollower`), with an htmx poll of their partial only while the
socket is not open. Cancel and Retry are POSTs, for users with the change permission, audited like
the task actions.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from threadmill import api

from . import audit
from .fragments import workflow_context
from .security import can_change, change_required, console_view
from .tables import PER_PAGE
from .views import _page_number, _partial


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
        "backend": alias, "backends": api.backend_aliases(), "page": page, "pages": pages, "query": request.GET,
        "watch_query": urlencode({"view": "workflows", "backend": alias, "page": str(page)}),
    }  # fmt: skip
    return render(request, _partial(request, "inspector/workflow_list.html", "workflows-table"), context)


@require_GET
@console_view
def workflow_detail(request, workflow_id: str):
    alias = _workflow_alias(request, workflow_id)
    try:
        context = workflow_context(alias, workflow_id, _page_number(request), can_change(request.user), request.GET)
    except api.TaskResultDoesNotExist as e:
        raise Http404(str(e)) from e
    return render(request, _partial(request, "inspector/workflow_detail.html", "workflow-graph"), context)


def _workflow_alias(request, workflow_id: str) -> str:
    """Return the backend a workflow URL names (`?backend=`), else the first that stores the workflow; 404 if none."""
    return _alias(request.GET) if "backend" in request.GET else _where(workflow_id)


def _where(workflow_id: str) -> str:
    alias = api.workflows.find_workflow(api.backend_aliases(), workflow_id)
    if alias is None:
        raise Http404(f"No workflow with id {workflow_id!r} is stored.")
    return alias


@require_POST
@console_view
@change_required
def cancel_workflow(request, workflow_id: str):
    alias = _workflow_alias(request, workflow_id)
    took = _or_404(api.workflows.cancel_workflow, alias, workflow_id, by=request.user.get_username())
    audit.record(request, "cancel", alias, "", "", f"workflow {workflow_id}", took)
    if took:
        messages.success(request, f"Workflow {workflow_id}: {_tasks(took)} cancelled, or asked to abort if running.")
    else:
        messages.warning(request, f"Workflow {workflow_id} was not cancelled: every task of it had finished.")
    return redirect(_detail_url(alias, workflow_id))


@require_POST
@console_view
@change_required
def retry_workflow(request, workflow_id: str):
    alias = _workflow_alias(request, workflow_id)
    took = _or_404(api.workflows.retry_workflow, alias, workflow_id)
    audit.record(request, "retry", alias, "", "", f"workflow {workflow_id}", took)
    if took:
        messages.success(request, f"Workflow {workflow_id}: {_tasks(took)} will run again.")
    else:
        messages.warning(request, f"Workflow {workflow_id} was not retried: no task of it had failed.")
    return redirect(_detail_url(alias, workflow_id))


def _or_404(action, alias: str, workflow_id: str, **kwargs) -> int:
    try:
        return action(alias, workflow_id, **kwargs)
    except api.TaskResultDoesNotExist as e:
        raise Http404(str(e)) from e


def _tasks(count: int) -> str:
    return f"{count} task{'' if count == 1 else 's'}"


def _detail_url(alias: str, workflow_id: str) -> str:
    return f"{reverse('inspector:workflow_detail', args=[workflow_id])}?{urlencode({'backend': alias})}"
