"""Operator controls of the console: pause and resume queues, set and clear their limits, quiet and stop workers,
requeue orphaned tasks, and the schedules page with its pause, resume and run now.

Each control is a POST with the CSRF token that the page confirms (`hx-confirm`) before it
is sent; without JavaScript it is a plain POST (a queue's limits are typed on a page of
their own, whose form is the confirmation). Each needs the change permission, writes an
audit entry, and redirects back with a message saying what happened.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from threadmill import api

from . import audit, forms
from .models import AuditEntry
from .security import can_change, change_required, console_view
from .views import _queue_or_404, _tasks

Action = AuditEntry.Action


def _who(request) -> str:
    return request.user.get_username()


# -- queues ------------------------------------------------------------------------------


@require_POST
@console_view
@change_required
def pause_queue(request, backend: str, queue: str):
    _queue_or_404(backend, queue)
    done = api.controls.pause_queue(backend, queue, by=_who(request))
    audit.record(request, Action.PAUSE, backend, queue, "", "queue", 0)
    if done:
        messages.success(request, f"Paused {queue}: workers take none of its tasks until it is resumed.")
    else:
        messages.warning(request, f"{queue} was paused already.")
    return redirect("inspector:queue_list")


@require_POST
@console_view
@change_required
def resume_queue(request, backend: str, queue: str):
    _queue_or_404(backend, queue)
    done = api.controls.resume_queue(backend, queue)
    audit.record(request, Action.RESUME, backend, queue, "", "queue", 0)
    say = messages.success if done else messages.warning
    say(request, f"Resumed {queue}." if done else f"{queue} was not paused.")
    return redirect("inspector:queue_list")


@require_http_methods(["GET", "POST"])
@console_view
@change_required
def queue_limits(request, backend: str, queue: str):
    _queue_or_404(backend, queue)
    form = forms.LimitForm(request.POST or None)
    if request.method == "POST" and form.is_valid() and _set_limits(request, backend, queue, form):
        return redirect("inspector:queue_list")
    state = api.controls.queue_limits(backend, [queue])[queue]
    context = {"active": "queues", "backend": backend, "queue_name": queue, "form": form, "state": state}
    context["words"] = {part: api.limits_text(getattr(state, part)) for part in ("setting", "runtime", "limit")}
    return render(request, "inspector/limit_detail.html", context, status=400 if request.method == "POST" else 200)


def _set_limits(request, backend: str, queue: str, form: forms.LimitForm) -> bool:
    """Set the form's limits, audited; False with the reason on the form when the backend refuses them."""
    concurrency, rate = form.cleaned_data["concurrency"], form.cleaned_data["rate"]
    rate_text = None if rate is None else str(rate)
    try:
        limit = api.controls.set_queue_limit(backend, queue, concurrency=concurrency, rate=rate_text, by=_who(request))
    except api.controls.LimitError as e:  # a limit below the partition count
        form.add_error(None, str(e))
        return False
    given = ", ".join(f"{name} {value}" for name, value in (("concurrency", concurrency), ("rate", rate)) if value)
    audit.record(request, Action.LIMIT, backend, queue, "", f"set {given}; in force: {api.limits_text(limit)}", 0)
    messages.success(request, f"Limits of {queue}: {api.limits_text(limit)}, until cleared.")
    return True


@require_POST
@console_view
@change_required
def clear_queue_limits(request, backend: str, queue: str):
    _queue_or_404(backend, queue)
    had = api.controls.clear_queue_limit(backend, queue)
    in_force = api.limits_text(api.controls.queue_limits(backend, [queue])[queue]) or "no limits"
    audit.record(request, Action.LIMIT, backend, queue, "", f"cleared; in force: {in_force}", 0)
    if had:
        messages.success(request, f"Cleared the runtime limits of {queue}; in force now: {in_force}.")
    else:
        messages.warning(request, f"{queue} had no runtime limits; in force: {in_force}.")
    return redirect("inspector:queue_list")


# -- worker processes ----------------------------------------------------------------------


@require_POST
@console_view
@change_required
def command_worker(request, backend: str, worker: str, command: str):
    if worker not in {w["worker"] for w in api.controls.live_worker_documents(backend)}:
        raise Http404(f"No live worker process named {worker!r} on backend {backend!r}.")
    api.controls.command_workers(backend, [worker], command, by=_who(request))
    audit.record(request, Action(command), backend, "", "", f"worker {worker}", 0)
    doing = "finish what it holds, take no new task and stay alive" if command == "quiet" else "stop gracefully"
    messages.success(request, f"Asked worker {worker} to {doing}; it takes the command within a second or two.")
    return redirect("inspector:worker_list")


# -- orphaned running tasks ----------------------------------------------------------------


@require_POST
@console_view
@change_required
def requeue_orphaned(request, backend: str, queue: str):
    _queue_or_404(backend, queue)
    done = api.controls.requeue_orphaned(backend, queue)
    audit.record(request, Action.REQUEUE, backend, queue, "running", "orphaned", len(done.moved), done.moved)
    text = f"Requeued {_tasks(len(done.moved))} whose worker is gone or whose lease is overdue"
    if done.skipped:
        text = f"{text}; {len(done.skipped)} came back to life meanwhile and stayed"
    if done.skipped or done.held_back:
        messages.warning(request, f"{text}. {done.notice}".strip())
    else:
        messages.success(request, text + ".")
    return redirect("inspector:task_list", backend, queue, api.Segment.RUNNING)


# -- schedules -----------------------------------------------------------------------------


@require_GET
@console_view
def schedule_list(request):
    context = {"active": "schedules", "rows": api.schedules.schedules(), "can_change": can_change(request.user)}
    return render(request, "inspector/schedule_list.html", context)


def _schedule_or_404(alias: str, name: str):
    try:
        return api.schedules.find_schedule(alias, name)
    except LookupError as e:
        raise Http404(str(e)) from e


@require_POST
@console_view
@change_required
def control_schedule(request, backend: str, name: str, command: str):
    schedule = _schedule_or_404(backend, name)
    if command == "run":
        return _run_schedule(request, backend, schedule)
    if command == "pause":
        done = api.schedules.pause_schedule(backend, name, by=_who(request))
        text = f"Paused schedule {name}: its runs are not enqueued until it is resumed."
    else:
        done = api.schedules.resume_schedule(backend, name)
        text = f"Resumed schedule {name}, from its next run."
    audit.record(request, Action(command), backend, "", "", f"schedule {name}", 0)
    if done:
        messages.success(request, text)
    else:
        messages.warning(request, f"Schedule {name} was {'paused' if command == 'pause' else 'not paused'} already.")
    return redirect("inspector:schedule_list")


def _run_schedule(request, backend: str, schedule):
    try:
        result = api.schedules.run_schedule(backend, schedule.name)
    except ImproperlyConfigured as e:  # its task cannot be imported any more
        messages.error(request, str(e))
        return redirect("inspector:schedule_list")
    ids = [result.id] if result else []
    queue = result.task.queue_name if result else ""
    audit.record(request, Action.RUN_NOW, backend, queue, "", f"schedule {schedule.name}", len(ids), ids)
    if result:
        messages.success(request, f"Enqueued a run of {schedule.name} now: task {result.id}.")
    else:
        messages.warning(request, f"Schedule {schedule.name} was not run.")
    return redirect("inspector:schedule_list")
