"""The console's bulk cancel on the waiting, ready, deferred and running segments: selected tasks, or all of a view.

Shaped like requeue: the first POST shows a confirmation with the server's counts (tasks that
will never run, running tasks whose workers will be asked to abort); above
`forms.TYPED_CANCEL_ABOVE` tasks it asks for the queue's name typed. The confirmed POST cancels,
writes one audit entry and redirects back with the counts of what happened.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from threadmill import api

from . import audit, forms
from .security import change_required, console_view
from .views import _filter, _partial, _queue_or_404, _running_tasks, _segment_url, _tasks, _view_text


@require_POST
@console_view
@change_required
def cancel_tasks(request, backend: str, queue: str, segment: api.Segment):
    _queue_or_404(backend, queue)
    if segment not in api.CANCELLABLE_SEGMENTS:
        raise BadRequest(f"Only waiting, ready, deferred and running tasks can be cancelled, not {segment.value} ones.")
    selection, where = forms.SelectionForm(request.POST), _filter(request.POST)
    if not selection.is_valid():
        raise BadRequest(forms.reason(selection))
    scope, ids = selection.cleaned_data["scope"], selection.cleaned_data["ids"]
    count = api.count_selected(backend, queue, segment, ids) if scope == "selected" else api.count_view(
        backend, queue, segment, where
    )  # fmt: skip
    typed = forms.CancelConfirmForm(request.POST, queue_name=queue, count=count)
    confirmed = request.POST.get("confirmed") == "yes"
    if not (confirmed and typed.is_valid()):
        context = _confirm_context(backend, queue, segment, scope, ids, where, count, typed if confirmed else None)
        template = _partial(request, "inspector/cancel_confirm.html", "cancel-confirmation")
        return render(request, template, context, status=400 if confirmed else 200)
    return _cancel(request, backend, queue, segment, scope, ids, where)


def _confirm_context(alias, queue_name, segment, scope, ids, where, count, form) -> dict:
    limit = api.CANCEL_VIEW_LIMIT if scope == "view" else count
    acting = min(count, limit)
    running = acting if segment is api.Segment.RUNNING else 0
    return {
        "active": "queues", "backend": alias, "queue_name": queue_name, "segment": segment, "scope": scope,
        "ids": ids, "where": where, "count": count, "count_text": _tasks(count), "limit": limit,
        "cancel_text": _tasks(acting - running), "abort_text": _running_tasks(running), "beyond_limit": count - acting,
        "typed": count > forms.TYPED_CANCEL_ABOVE, "form": form,
        "back_url": _segment_url(alias, queue_name, segment, where),
    }  # fmt: skip


def _cancel(request, alias, queue_name, segment, scope, ids, where):
    by = request.user.get_username()
    if scope == "selected":
        done, scope_text = api.cancel_selected(alias, queue_name, ids, by=by), "selected tasks"
    else:
        done, scope_text = api.cancel_view(alias, queue_name, segment, where, by=by), _view_text(where)
    audit.record(request, "cancel", alias, queue_name, segment.value, scope_text, len(done.took), done.took)
    say = messages.success if not (done.left or done.beyond_limit) else messages.warning
    say(request, _said(done))
    return redirect(_segment_url(alias, queue_name, segment, where))


def _said(done: api.Cancelled) -> str:
    text = (
        f"Cancelled {_tasks(len(done.cancelled))}; abort requested for {_running_tasks(len(done.abort_requested))}; "
        f"{len(done.already_finished)} already finished."
    )
    if done.left:
        text += f" {_tasks(len(done.left))} could not be cancelled: unreadable, gone, or of another queue."
    if done.beyond_limit:
        text += f" {_tasks(done.beyond_limit)} more of this view were left alone: cancel again to reach them."
    return text
