"""Template helpers of the Tasks pages: durations in human units."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def human_seconds(value: float | None) -> str:
    """A duration in human units: 850 ms, 2.4 s, 3 min 05 s, 2 h 05 min; an em dash for none."""
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms" if value >= 0.001 else f"{value * 1e6:.0f} µs"
    if value < 60:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"


@register.filter
def percent(value: float) -> str:
    """A share as a percentage with one decimal."""
    return f"{100 * value:.1f}%"
