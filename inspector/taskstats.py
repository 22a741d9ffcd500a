"""The Tasks pages: every task path's runs, failures, durations and waits, and one path's charts.

Read from the per-task-path counts the workers send (`threadmill.backends.taskstats`); a
page's reads are one pipeline per backend, whatever the number of tasks stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.core.exceptions import BadRequest
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from threadmill import api

from .charts import HEIGHT, WIDTH, polylines
from .converters import TaskPathConverter
from .security import console_view
from .templatetags.inspector_tasks import human_seconds
from .views import _partial, _queue_or_404, _segment_url

_PATH = re.compile(TaskPathConverter.regex)
#: The spans the list shows: query value -> (title, minutes).
SPANS = {"1h": ("last hour", 60), "24h": ("last 24 hours", 24 * 60)}
#: The columns the list sorts by: query value -> key (largest first).
SORTS = {
    "runs": lambda r: r.stats.runs,
    "failures": lambda r: r.stats.failure_rate,
    "p50": lambda r: r.p50 or 0.0,
    "p95": lambda r: r.p95 or 0.0,
    "wait": lambda r: r.wait_p95 or 0.0,
    "time": lambda r: r.stats.run_us,
    "task": None,
}


@dataclass(frozen=True, slots=True)
class PathRow:
    """One row of the Tasks list."""

    alias: str
    stats: api.metrics.PathStats
    p50: float | None
    p95: float | None
    wait_p95: float | None
    #: The path's per-task limit (`@task(concurrency=, rate=)`) and its runs leased now; None without one.
    limit: api.metrics.TaskLimitState | None = None

    @property
    def limit_text(self) -> str:
        """The path's limit and what runs against it, in words: "3 at once (2 running), 100/m"."""
        if self.limit is None:
            return ""
        parts = []
        if self.limit.limit.concurrency is not None:
            parts.append(f"{self.limit.limit.concurrency} at once ({self.limit.running} running)")
        if self.limit.limit.rate is not None:
            rate = str(self.limit.limit.rate)
            wait = self.limit.next_token_s
            parts.append(rate if wait is None else f"{rate} (the next start in {wait:.1f} s)")
        return ", ".join(parts)

    @property
    def linkable(self) -> bool:
        """Whether the path has a page (a path stored by hand, not by a worker, may not fit its URL)."""
        return _PATH.fullmatch(self.stats.path) is not None and "/" not in self.stats.queue

    @classmethod
    def of(cls, alias: str, stats: api.metrics.PathStats, limit: api.metrics.TaskLimitState | None = None) -> PathRow:
        p50, p95, wait = stats.duration_quantile(0.5), stats.duration_quantile(0.95), stats.wait_quantile(0.95)
        return cls(alias, stats, p50, p95, wait, limit)


def _choice(request, name: str, choices, default: str) -> str:
    value = request.GET.get(name, default)
    if value not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}, not {value[:20]!r}.")
    return value


@require_GET
@console_view
def task_path_list(request):
    span = _choice(request, "span", SPANS, "1h")
    sort = _choice(request, "sort", SORTS, "runs")
    title, minutes = SPANS[span]
    rows = []
    for alias in api.backend_aliases():
        limits = api.metrics.task_limits(alias)
        rows += [PathRow.of(alias, s, limits.get(s.path)) for s in api.metrics.task_paths(alias, minutes=minutes)]
    key = SORTS[sort]
    if key is None:
        rows.sort(key=lambda r: (r.stats.path, r.stats.queue, r.alias))
    else:
        rows.sort(key=key, reverse=True)
    context = {
        "active": "tasks",
        "rows": rows,
        "span": span,
        "span_title": title,
        "spans": SPANS,
        "sort": sort,
        "columns": _COLUMNS,
    }
    return render(request, _partial(request, "inspector/task_paths.html", "task-paths"), context)


_COLUMNS = (
    ("task", "Task"),
    ("runs", "Runs"),
    ("failures", "Failure rate"),
    ("p50", "p50 duration"),
    ("p95", "p95 duration"),
    ("wait", "p95 wait"),
    ("time", "Total time"),
)


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart of the path page: its lines (CSS class, points) and what it says to a screen reader."""

    description: str
    peak: str
    lines: list[tuple[str, list[str]]]


@require_GET
@console_view
def task_path_detail(request, backend: str, queue: str, path: str):
    _queue_or_404(backend, queue)
    minutes = api.metrics.task_path_minutes(backend, queue, path, minutes=60)
    total = api.metrics.PathStats(queue, path)
    for _, stats in minutes:
        total.merge(stats)
    if not any(stats.runs for _, stats in minutes) and not _known_path(backend, queue, path):
        raise Http404(f"No runs of {path!r} on queue {queue!r} are recorded.")
    runs = [float(s.runs) for _, s in minutes]
    failures = [float(s.failed + s.retried) for _, s in minutes]
    p50 = [s.duration_quantile(0.5) for _, s in minutes]
    p95 = [s.duration_quantile(0.95) for _, s in minutes]
    wait = [s.wait_quantile(0.95) for _, s in minutes]
    peak_runs = max(runs, default=0.0)
    slowest = max((v for v in p95 if v is not None), default=0.0)
    longest_wait = max((v for v in wait if v is not None), default=0.0)
    charts = [
        Chart("runs and failed attempts per minute, last hour", f"{peak_runs:,.0f} / min",
              [("failed", polylines(failures, peak_runs)), ("out", polylines(runs, peak_runs))]),
        Chart("p50 and p95 duration per minute, last hour", human_seconds(slowest) if slowest else "—",
              [("p50", polylines(p50, slowest)), ("p95", polylines(p95, slowest))]),
        Chart("p95 queue wait per minute, last hour", human_seconds(longest_wait) if longest_wait else "—",
              [("latency", polylines(wait, longest_wait))]),
    ]  # fmt: skip
    where = api.Filter(task_path=path)
    context = {
        "active": "tasks",
        "backend": backend,
        "queue_name": queue,
        "path": path,
        "row": PathRow.of(backend, total, api.metrics.task_limits(backend).get(path)),
        "errors": sorted(total.errors.items(), key=lambda item: -item[1]),
        "charts": charts,
        "width": WIDTH,
        "height": HEIGHT,
        "segments": [(segment, _segment_url(backend, queue, segment, where)) for segment in api.Segment],
    }
    return render(request, "inspector/task_path.html", context)


def _known_path(alias: str, queue: str, path: str) -> bool:
    return any(s.queue == queue and s.path == path for s in api.metrics.task_paths(alias, minutes=None))
