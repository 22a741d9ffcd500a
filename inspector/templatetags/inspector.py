"""Template helpers of the console: timestamps, pretty (escaped by the template) JSON, durations."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from threadmill.backends.base import return_value_of

register = template.Library()

#: Characters of a value shown before it is collapsed behind "show all".
COLLAPSE_AFTER_CHARS = 2000
#: Most characters of a value the page carries at all; past it, it is cut.
MAX_VALUE_CHARS = 200_000


@register.filter
def moment(value: datetime | None):
    """Render an aware datetime as a <time> element, None as a dash."""
    if value is None:
        return "—"
    return format_html('<time datetime="{}">{}</time>', value.isoformat(), value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])


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


@register.filter
def seconds(value: float | None):
    return "—" if value is None else f"{value:.0f} s" if value < 120 else f"{value / 60:.0f} min"


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
