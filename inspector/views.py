"""The console's pages and actions: function views, staff-only, htmx partials of the same templates."""

from __future__ import annotations

import re

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.core.paginator import EmptyPage
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from threadmill import api

from . import audit, forms
from .fragments import overview_context, task_context, workers_context
from .models import AuditEntry
from .security import can_change, change_required, console_view
from .tables import PER_PAGE, segment_table


def _partial(request, template_name: str, partial: str) -> str:
    """Return the template to render: the named partial of it for an htmx request that swaps that partial.

    A boosted link (paging, sorting) that targets the partial gets the partial; a boosted
    link that replaces the whole body gets the whole page.
    """
    htmx = request.htmx
    if htmx and (not htmx.boosted or htmx.target == partial):
        return f"{template_name}#{partial}"
    return template_name


def _queue_or_404(alias: str, queue_name: str) -> None:
    if not api.has_queue(alias, queue_name):
        raise Http404(f"No queue named {queue_name!r} on backend {alias!r}.")


#: Highest page number a console page accepts.
MAX_PAGE = 10**9
# ASCII digits only: str.isdigit() also passes '²' and '①', which int() refuses, and an
# unbounded run of digits reaches int()'s 4,300-digit limit.
_PAGE_NUMBER = re.compile(r"[0-9]{1,10}")


def _page_number(request) -> int:
    raw = request.GET.get("page", "1")
    if not _PAGE_NUMBER.fullmatch(raw) or not 1 <= int(raw) <= MAX_PAGE:
        raise BadRequest(f"The page number must be a whole number from 1 to {MAX_PAGE:,}, not {raw[:20]!r}.")
    return int(raw)


def _filter(data) -> api.Filter:
    form = forms.FilterForm(data)
    if not form.is_valid():
        raise BadRequest(forms.reason(form))
    return form.cleaned_data["where"]


def _segment_url(alias: str, queue_name: str, segment: api.Segment, where: api.Filter = api.NO_FILTER) -> str:
    url = reverse("inspector:task_list", args=[alias, queue_name, segment])
    query = {k: v for k, v in (("task", where.task_path), ("error", where.error_class), ("q", where.text)) if v}
    return f"{url}?{urlencode(query)}" if query else url


# -- pages -----------------------------------------------------------------------------


@require_GET
@console_view
def queue_list(request):
    context = {"active": "queues", **overview_context(can_change(request.user))}
    return render(request, _partial(request, "inspector/queue_list.html", "queues-table"), context)


@require_GET
@console_view
def task_list(request, backend: str, queue: str, segment: api.Segment):
    _queue_or_404(backend, queue)
    where, page_number, lease = _filter(request.GET), _page_number(request), _lease(request.GET, segment)
    keyset = _keyset(request.GET, backend, where, lease)
    table = segment_table(request, backend, queue, segment, where, page_number, can_change(request.user), lease, keyset)
    if keyset is None:
        _paginate(table, page_number)
    context = {
        "active": "queues", "backend": backend, "queue_name": queue, "segment": segment, "table": table, "where": where,
        "segments": list(api.Segment), "can_change": can_change(request.user), "lease": lease,
        "requeueable": segment in api.REQUEUEABLE_SEGMENTS, "cancellable": segment in api.CANCELLABLE_SEGMENTS,
        "deletable": segment in api.DELETABLE_SEGMENTS,
        "filter_form": forms.FilterForm(request.GET or None),
        "lease_flags": api.controls.LEASE_FLAGS if segment is api.Segment.RUNNING else (),
    }  # fmt: skip
    if not request.htmx:
        total = api.count_view(backend, queue, segment)
        context["watch_query"] = urlencode(
            {"view": "segment", "backend": backend, "queue": queue, "segment": segment.value, "total": total}
        )
    if segment is api.Segment.RUNNING and request.htmx and request.htmx.trigger == "running-progress":
        # The running page's poll: the rows' progress cells alone, swapped in place by id.
        return render(request, "inspector/task_list.html#progress-cells", context)
    if segment is api.Segment.FAILED and not request.htmx:
        context["error_classes"] = _error_classes(backend, queue, where)
    if segment is api.Segment.RUNNING and context["can_change"] and not request.htmx:
        context["orphaned"] = len(api.controls.orphaned(backend, queue))
    return render(request, _partial(request, "inspector/task_list.html", "tasks-table"), context)


#: Newest failed tasks whose error classes the error-class filter offers: a bounded read, one round trip.
ERROR_CLASS_SAMPLE = 200


def _error_classes(alias: str, queue_name: str, where: api.Filter) -> list[str]:
    """Return the error classes of the newest failed tasks, and the one filtered by, for the filter to offer."""
    found = api.page(alias, queue_name, api.Segment.FAILED, 0, ERROR_CLASS_SAMPLE)
    classes = {item.errors[-1].exception_class_path for item in found.items if getattr(item, "errors", None)}
    return sorted(classes | ({where.error_class} if where.error_class else set()))


def _lease(data, segment: api.Segment) -> str:
    """Return the running view's lease filter ("gone", "overdue" or ""); 400 for anything else."""
    lease = data.get("lease", "")
    if lease and lease not in api.controls.LEASE_FLAGS:
        flags = " or ".join(api.controls.LEASE_FLAGS)
        raise BadRequest(f"The lease filter is {flags}, not {lease[:20]!r}.")
    if lease and segment is not api.Segment.RUNNING:
        raise BadRequest("The lease filter applies to the running segment only.")
    return lease


def _keyset(data, alias: str, where: api.Filter, lease: str) -> tuple[api.Cursor | None, api.Cursor | None] | None:
    """Return the (after, before) cursors of a view paged by cursor, or None for a view paged by offset.

    An unfiltered view of a partitioned alias pages by cursor: an offset deep into partitions
    merged in queue order reads every partition's head up to it. A malformed cursor is a 400
    in any view; a filtered view, or one partition, ignores a well-formed one.
    """
    after, before = _cursor(data, "after"), _cursor(data, "before")
    if after and before:
        raise BadRequest("A page follows one cursor: give after or before, not both.")
    if where or lease or not api.is_partitioned(alias):
        return None
    return after, before


def _cursor(data, name: str) -> api.Cursor | None:
    raw = data.get(name, "")
    try:
        return api.decode_cursor(raw) if raw else None
    except ValueError as e:
        raise BadRequest(f"The {name!r} parameter is not a page cursor. {e}") from None


def _paginate(table, page_number: int) -> None:
    try:
        table.paginate(page=page_number, per_page=PER_PAGE)
    except EmptyPage:
        # The segment shrank under the user (a purge, a drain): show its last page.
        table.paginate(page=max(1, table.paginator.num_pages), per_page=PER_PAGE)


@require_GET
@console_view
def task_detail(request, backend: str, task_id: str):
    try:
        context = {"active": "queues", **task_context(backend, task_id, can_change(request.user))}
    except api.TaskResultDoesNotExist as e:
        raise Http404(str(e)) from e
    if not request.htmx:  # the live refresh swaps the status alone
        context["workflow"] = api.workflows.task_workflow(backend, task_id)
    return render(request, _partial(request, "inspector/task_detail.html", "task-status"), context)


def _task_or_404(alias: str, task_id: str):
    try:
        return api.task(alias, task_id)
    except api.TaskResultDoesNotExist as e:
        raise Http404(str(e)) from e


def _queue_of(task) -> str:
    return task.queue_name if isinstance(task, api.UnreadableTask) else task.task.queue_name


@require_GET
@console_view
def worker_list(request):
    context = {"active": "workers", **workers_context(can_change(request.user))}
    return render(request, _partial(request, "inspector/worker_list.html", "workers-table"), context)


@require_GET
@console_view
def audit_list(request):
    page = _audit_page(request)
    return render(request, "inspector/audit_list.html", {"active": "audit", "page": page})


def _audit_page(request):
    from django.core.paginator import Paginator

    try:
        return Paginator(AuditEntry.objects.all(), PER_PAGE).page(_page_number(request))
    except EmptyPage as e:
        raise Http404("There is no such page of the audit log.") from e


# -- actions ---------------------------------------------------------------------------


@require_POST
@console_view
@change_required
def requeue_task(request, backend: str, task_id: str):
    force, seen = _force(request.POST), _seen(request.POST)
    task = _task_or_404(backend, task_id)
    done = api.requeue(backend, task_id, force=force, seen=seen)
    segment = str(seen or task.segment or "")
    audit.record(
        request, "requeue", backend, _queue_of(task), segment, "one task", len(done.moved), done.moved, forced=force
    )
    _say_task_requeued(request, task_id, segment, done, force)
    return redirect("inspector:task_detail", backend, task_id)


@require_POST
@console_view
@change_required
def cancel_task(request, backend: str, task_id: str):
    task = _task_or_404(backend, task_id)
    outcome = api.cancel(backend, [task_id], by=request.user.get_username())[task_id]
    segment = str(task.segment or "")
    took = [task_id] if outcome.took else []
    audit.record(request, "cancel", backend, _queue_of(task), segment, "one task", len(took), took)
    say = messages.success if outcome.took else messages.warning
    say(request, _CANCEL_SAYS[outcome].format(task_id))
    return redirect("inspector:task_detail", backend, task_id)


#: What the console says after a cancel, by outcome.
_CANCEL_SAYS = {
    api.CancelOutcome.CANCELLED: "Cancelled task {}: it will not run.",
    api.CancelOutcome.ABORT_REQUESTED: "Task {} is running: its worker was asked to abort it.",
    api.CancelOutcome.ALREADY_FINISHED: "Task {} was not cancelled: it had already finished.",
    api.CancelOutcome.UNKNOWN: "Task {} was not cancelled: it no longer exists.",
    api.CancelOutcome.UNREADABLE: "Task {} was not cancelled: it is unreadable.",
    api.CancelOutcome.KEPT_MOVING: "Task {} was not cancelled: it kept moving; try again.",
}


def _say_task_requeued(request, task_id: str, segment: str, done: api.Requeued, force: bool) -> None:
    if done.moved:
        messages.success(request, f"Requeued task {task_id}." + (_FORCED if force else ""))
    elif done.skipped:
        messages.warning(
            request,
            f"Task {task_id} was not requeued: it is running, its worker is alive and its lease current. "
            "Tick “force” to requeue it anyway: it may then run twice.",
        )
    else:
        state = "already ready" if segment == "ready" else f"no longer {segment}"
        messages.warning(request, f"Task {task_id} was not requeued: it is {state}.")


#: What a forced requeue risks, said after it.
_FORCED = " Forced: a task still running on a live worker may run twice."


def _seen(data) -> api.Segment | None:
    form = forms.SeenSegmentForm(data)
    if not form.is_valid():
        raise BadRequest(forms.reason(form))
    return form.cleaned_data["seen"]


def _force(data) -> bool:
    form = forms.ForceForm(data)
    if not form.is_valid():
        raise BadRequest(forms.reason(form))
    return form.cleaned_data["force"]


@require_POST
@console_view
@change_required
def requeue_tasks(request, backend: str, queue: str, segment: api.Segment):
    _queue_or_404(backend, queue)
    if segment not in api.REQUEUEABLE_SEGMENTS:
        raise BadRequest("Tasks in the ready segment are already waiting to run; there is nothing to requeue.")
    return _action(request, "requeue", backend, queue, segment)


@require_POST
@console_view
@change_required
def delete_tasks(request, backend: str, queue: str, segment: api.Segment):
    _queue_or_404(backend, queue)
    if segment not in api.DELETABLE_SEGMENTS:
        raise BadRequest(api.WAITING_NOT_DELETABLE)
    return _action(request, "delete", backend, queue, segment)


def _action(request, action: str, alias: str, queue_name: str, segment: api.Segment):
    """Show the confirmation with the server's count, or, once confirmed, act, audit and redirect."""
    selection, where = forms.SelectionForm(request.POST), _filter(request.POST)
    if not selection.is_valid():
        raise BadRequest(forms.reason(selection))
    scope, ids, force = (selection.cleaned_data[name] for name in ("scope", "ids", "force"))
    if action == "delete" and scope != "selected":
        raise BadRequest("Delete acts on selected tasks only; purge empties a whole segment.")
    if request.POST.get("confirmed") != "yes":
        return _confirm(request, action, alias, queue_name, segment, scope, ids, where)
    scope_text = "selected tasks" if scope == "selected" else _view_text(where)
    if action == "delete":
        done = api.delete(alias, queue_name, segment, ids)
        audit.record(request, action, alias, queue_name, segment.value, scope_text, len(done), done)
        messages.success(request, f"Deleted {_tasks(len(done))}.")
    else:
        _requeue(request, alias, queue_name, segment, scope, scope_text, ids, where, force)
    return redirect(_segment_url(alias, queue_name, segment, where))


def _view_text(where: api.Filter) -> str:
    text = f"view {where.task_path or '*'} {where.error_class}".strip()
    return f"{text} text {where.text!r}" if where.text else text


def _tasks(count: int) -> str:
    return f"{count} task{'' if count == 1 else 's'}"


def _running_tasks(count: int) -> str:
    return f"{count} running task{'' if count == 1 else 's'}"


def _requeue(request, alias, queue_name, segment, scope, scope_text, ids, where, force: bool) -> None:
    if scope == "selected":
        done = api.requeue_selected(alias, queue_name, segment, ids, force=force)
    else:
        done = api.requeue_view(alias, queue_name, segment, where, force=force)
    moved = done.moved
    audit.record(request, "requeue", alias, queue_name, segment.value, scope_text, len(moved), moved, forced=force)
    _say_requeued(request, done, force)


def _say_requeued(request, done: api.Requeued, force: bool) -> None:
    text = f"Requeued {_tasks(len(done.moved))}"
    if not done.skipped:
        messages.success(request, text + ("." + _FORCED if force else "."))
        return
    were, their = ("was", "its worker is") if len(done.skipped) == 1 else ("were", "their workers are")
    lease = "its lease" if len(done.skipped) == 1 else "their leases"
    messages.warning(
        request, f"{text}; {_running_tasks(len(done.skipped))} {were} skipped: {their} alive and {lease} current."
    )


def _confirm(request, action, alias, queue_name, segment, scope, ids, where):
    if scope == "selected":
        count = api.count_selected(alias, queue_name, segment, ids)
        live = api.live_in_selection(alias, queue_name, segment, ids) if action == "requeue" else []
    else:
        count = api.count_view(alias, queue_name, segment, where)
        live = api.live_in_view(alias, queue_name, segment, where) if action == "requeue" else []
    context = {
        "action": action, "backend": alias, "queue_name": queue_name, "segment": segment, "scope": scope,
        "ids": ids, "where": where, "count": count, "count_text": _tasks(count), "active": "queues",
        "back_url": _segment_url(alias, queue_name, segment, where),
        "live_count": len(live), "live_text": _running_tasks(len(live)),
    }  # fmt: skip
    return render(request, _partial(request, "inspector/action_confirm.html", "action-confirmation"), context)


@require_http_methods(["GET", "POST"])
@console_view
@change_required
def purge_segment(request, backend: str, queue: str, segment: api.Segment):
    _queue_or_404(backend, queue)
    if segment not in api.DELETABLE_SEGMENTS:
        raise BadRequest(api.WAITING_NOT_DELETABLE)
    form = forms.PurgeForm(request.POST or None, queue_name=queue)
    if request.method == "POST" and form.is_valid():
        removed = api.purge(backend, queue, segment)
        audit.record(request, "purge", backend, queue, segment.value, "whole segment", removed)
        messages.success(request, f"Purged {_tasks(removed)} from {queue} {segment.value}.")
        return redirect(_segment_url(backend, queue, segment))
    context = {"active": "queues", "backend": backend, "queue_name": queue, "segment": segment, "form": form}
    context["count"] = api.count_view(backend, queue, segment)
    status = 400 if request.method == "POST" else 200
    return render(request, "inspector/purge_confirm.html", context, status=status)


# -- search ----------------------------------------------------------------------------


@require_GET
@console_view
def search(request):
    """Jump to a task by id, whatever its queue or segment; else filter the current segment by the text."""
    form = forms.SearchForm(request.GET)
    if not form.is_valid():
        raise BadRequest(forms.reason(form))
    found = _find_task(form.task_id) if form.task_id else None
    if found:
        return redirect("inspector:task_detail", found, form.task_id)
    alias, queue_name, segment = (form.cleaned_data[k] for k in ("backend", "queue", "segment"))
    if alias in api.backend_aliases() and segment and api.has_queue(alias, queue_name):
        return redirect(_segment_url(alias, queue_name, api.Segment(segment), api.Filter(text=form.cleaned_data["q"])))
    context = {"active": "", "q": form.cleaned_data["q"], "looked_for_id": bool(form.task_id)}
    return render(request, "inspector/search.html", context, status=404)


def _find_task(task_id: str) -> str | None:
    """Return the alias of the backend that stores a task with this id, or None."""
    for alias in api.backend_aliases():
        try:
            api.task(alias, task_id)
        except api.TaskResultDoesNotExist:
            continue
        return alias
    return None
