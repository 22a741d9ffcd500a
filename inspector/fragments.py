"""The context of the live parts of the console, shared by the pages and the websocket."""

from __future__ import annotations

import time

from django.urls import NoReverseMatch, reverse

from threadmill import api


def segment_url(alias: str, queue_name: str, segment: api.Segment) -> str | None:
    """Return a segment's console URL, or None for a queue name no URL can carry (one with a slash)."""
    try:
        return reverse("inspector:task_list", args=[alias, queue_name, segment])
    except NoReverseMatch:
        return None


def sparkline_points(values: list[int], width: int = 120, height: int = 24) -> str:
    """Return an SVG polyline's points for a series, scaled to the box."""
    if not values:
        return ""
    top = max(values) or 1
    step = width / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{height - (v / top) * (height - 2) - 1:.1f}" for i, v in enumerate(values))


def overview_context() -> dict:
    """Return what the overview's queue table shows."""
    summaries = api.overview()
    rows = [
        {
            "summary": s,
            "counts": [
                (segment, s.counts[segment], segment_url(s.alias, s.queue_name, segment)) for segment in api.Segment
            ],
            "ingress_points": sparkline_points(s.ingress),
            "egress_points": sparkline_points(s.egress),
        }
        for s in summaries
    ]
    return {"queue_rows": rows, "segments": list(api.Segment)}


def workers_context() -> dict:
    """Return what the workers table shows: hosts, each with its worker processes."""
    now = time.time()
    hosts: dict[str, list] = {}
    for worker in api.hub().workers(now):
        hosts.setdefault(worker.host, []).append(
            {"worker": worker, "uptime_s": worker.uptime_s(now), "seen_s_ago": max(0.0, now - worker.last_seen)}
        )
    live = sum(1 for workers in hosts.values() for w in workers if w["worker"].state == "live")
    return {"hosts": sorted(hosts.items()), "live_workers": live, "warming_up": not api.hub().warmed_up(now)}
