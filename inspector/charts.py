"""History charts of the overview, drawn on the server as inline SVG (no script, so the strict CSP holds).

Each queue gets two windows, the last hour per minute and the last 24 hours per quarter-hour
(aligned to :00, :15, :30 and :45, the open quarter last), each with two panels: tasks in, out
and failed, and latency. A gap in the latency series (no broker sampled it) is a gap in the
line, not a drop to zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from threadmill import api

#: Width and height of one chart panel, in SVG user units.
WIDTH, HEIGHT = 240, 48
#: The windows each queue is charted over: title and what a point is.
WINDOWS = (("1 hour", "min"), ("24 hours", "15 min"))


@dataclass(frozen=True, slots=True)
class Line:
    """One series drawn as polylines (one per run of known values) in the CSS class `kind`."""

    kind: str
    label: str
    segments: list[str]


@dataclass(frozen=True, slots=True)
class Panel:
    """One chart panel: its lines, the peak that tops its scale, and what it says to a screen reader."""

    lines: list[Line]
    peak: str
    description: str


@dataclass(frozen=True, slots=True)
class Window:
    """One window of a queue's history: its title and its two panels."""

    title: str
    throughput: Panel
    latency: Panel

    @property
    def panels(self) -> tuple[Panel, Panel]:
        return (self.throughput, self.latency)


def polylines(values: Sequence[float | None], top: float, width: int = WIDTH, height: int = HEIGHT) -> list[str]:
    """Return the `points` of one polyline per run of known values, scaled so `top` reaches the panel's top."""
    step = width / max(1, len(values) - 1)
    top = top or 1
    runs: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if value is None:
            runs.append([])
            continue
        runs[-1].append(f"{i * step:.1f},{height - (value / top) * (height - 2) - 1:.1f}")
    # A lone known value between gaps is drawn as a dot-length line, so it still shows.
    return [" ".join(run if len(run) > 1 else [*run, run[0]]) for run in runs if run]


def window(title: str, history: api.history.History, per: str) -> Window:
    """Return one window's two panels from its (already bucketed) history."""
    peak = max([*history.enqueued, *history.finished, *history.failed, 0])
    throughput = Panel(
        [  # failed first: on a quiet queue all three lie on the axis, and in and out matter more
            Line("failed", "failed", polylines(history.failed, peak)),
            Line("out", "out", polylines(history.finished, peak)),
            Line("in", "in", polylines(history.enqueued, peak)),
        ],
        f"{peak:,} / {per}",
        f"tasks in, out and failed per {per}, last {title}",
    )
    known = [v for v in history.latency_s if v is not None]
    slowest = max(known, default=0.0)
    latency = Panel(
        [Line("latency", "latency", polylines(history.latency_s, slowest))],
        "—" if not known else f"{slowest:,.1f} s",
        f"latency (age of the oldest ready task), last {title}",
    )
    return Window(title, throughput, latency)


def queue_charts(alias: str, queue_name: str, now: float | None = None) -> list[Window]:
    """Return the 1-hour and 24-hour windows of one queue (the day in clock-aligned quarter-hours)."""
    read = api.history.charted(alias, queue_name, now=now)
    return [window(title, history, per) for (title, per), history in zip(WINDOWS, read, strict=True)]
