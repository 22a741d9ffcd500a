"""Template helpers of the console: timestamps (relative, with the exact value and zone), pretty (escaped by the template) JSON, durations."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from threadmill.base import return_value_of

from .inspector_tasks import human_seconds

register = template.Library()

#: Characters of a value shown before it is collapsed behind "show all".
COLLAPSE_AFTER_CHARS = 2000
#: Most characters of a value the page carries at all; past it, it is cut.
MAX_VALUE_CHARS = 200_000


def relative(delta_s: float) -> str:
    """Say how far a moment lies from now, `delta_s` seconds ahead (negative: behind): "3 min ago", "in 12 s".

    console.js counts the same way when it keeps these fresh on a live page.
    """
    span = abs(delta_s)
    if span < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if span >= size:
            amount = f"{span // size:.0f} {unit}"
            break
    else:
        amount = f"{span:.0f} s"
    return f"in {amount}" if delta_s > 0 else f"{amount} ago"


@register.filter
def moment(value: datetime | None, where: str = ""):
    """Render an aware datetime as a relative <time>, None as a dash; `moment:"link"` inside a link (no focus of its own)."""
    return moment_html(value, focusable=where != "link")


def moment_html(value: datetime | None, *, now: float | None = None, focusable: bool = True):
    """Render an aware datetime as a <time> saying how long ago (or ahead) it is, its exact value and zone as title.

    The zone is the site's `TIME_ZONE` (UTC unless set). A focusable element lets a keyboard
    or a tap show the exact value too (console.css); None renders as a dash.
    """
    if value is None:
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    local = timezone.localtime(value)
    exact = f"{local.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} {local.tzname()}"
    ago = relative(value.timestamp() - (time.time() if now is None else now))
    focus = mark_safe(' tabindex="0"') if focusable else ""
    return format_html('<time datetime="{}" title="{}"{}>{}</time>', value.isoformat(), exact, focus, ago)


@register.simple_tag
def progress_bar(task_id: str, progress, oob: bool = False):
    """Render a task's reported progress as a <progress> bar and its note (text: it comes from Redis)."""
    swap = mark_safe(' hx-swap-oob="true"') if oob else ""
    if progress is None:
        return format_html('<span id="progress-{}" class="progress muted"{}>—</span>', task_id, swap)
    if progress.total:
        share = f"{100 * progress.done / progress.total:.0f}%"
        bar = format_html('<progress max="{}" value="{}">{}</progress> {}', progress.total, progress.done, share, share)
    else:
        bar = format_html("<progress></progress> {} done", progress.done)
    note = format_html('<span class="note">{}</span>', progress.note)
    return format_html('<span id="progress-{}" class="progress"{}>{} {}</span>', task_id, swap, bar, note)


@register.filter
def return_value(result):
    return return_value_of(result)


@register.simple_tag
def pretty(value) -> dict:
    """Return a value as indented JSON text (the template escapes it), collapsed when long."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)
    size = len(text)
    full = text[:MAX_VALUE_CHARS]
    return {
        "text": full[:COLLAPSE_AFTER_CHARS],
        "full": full,
        "cut": size > COLLAPSE_AFTER_CHARS,
        "size": size,
        "shown": min(size, COLLAPSE_AFTER_CHARS),
    }


#: Durations, latency, lease age and uptime in human units ("850 ms", "2.4 s", "3 min 05 s"), as the Tasks pages say them.
duration = register.filter("duration", human_seconds)


@register.filter
def span(value: timedelta | None):
    """Render a duration to the millisecond below a minute, else in minutes and seconds; None as a dash."""
    if value is None:
        return "—"
    total = value.total_seconds()
    if total < 60:
        return f"{total:.3f} s"
    minutes, rest = divmod(int(total), 60)
    return f"{minutes} min {rest} s"


@register.filter
def megabytes(value: int | None):
    return "—" if not value else f"{value / 1_000_000:.1f} MB"
