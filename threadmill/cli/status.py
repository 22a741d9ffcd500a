"""`manage.py threadmill status [--json]`: queues and live workers, for a terminal or a script.

Exit code 1 when a queue that is not paused has ready tasks and no live worker serves it:
the state in which nothing will ever run them. A throttled queue (its limits hold its ready
tasks back) is not stuck: it says so, and does not change the exit code.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from django.core.management.base import BaseCommand

from ..backends.base import Segment
from ..identity import WorkerName
from .common import add_backend_argument, threadmill_backend

HELP = "Print each queue (counts, latency, paused) and the live workers; exit 1 if ready tasks have no worker."

#: Exit code when a queue has ready tasks and no live worker serves it.
EXIT_UNSERVED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_argument(parser)
    parser.add_argument("--json", action="store_true", help="Print one JSON object instead of tables.")


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    backend = threadmill_backend(options["backend"])
    status = collect(backend, time.time())
    if options["json"]:
        command.stdout.write(json.dumps(status, indent=2))
    else:
        command.stdout.write(render(status))
    return EXIT_UNSERVED if any(q["unserved"] for q in status["queues"]) else 0


def collect(backend, now: float) -> dict[str, Any]:
    """Return the backend's queues and live workers as one JSON-ready dict."""
    stats = backend.queue_stats()
    oldest = backend.oldest_ready_enqueued_at(list(stats))
    paused = backend.paused_queues()
    workers = backend.live_workers()
    totals = backend.totals()
    limits = backend.queue_limits(list(stats))
    holding = backend.holding_task_limits()
    queues = []
    for name, counts in stats.items():
        serving = [w["worker"] for w in workers if name in w.get("queues", ())]
        pause = paused.get(name)
        held = holding.get(name, []) if counts[Segment.READY] else []
        queues.append(
            {
                "queue": name,
                **{segment.value: counts[segment] for segment in Segment},
                "latency_s": None if oldest[name] is None else round(max(0.0, now - oldest[name].timestamp()), 3),
                "paused": None if pause is None else {"by": pause.by, "since": pause.since.timestamp()},
                "workers": len(serving),
                "unserved": bool(counts[Segment.READY]) and not serving and pause is None,
                "totals": totals.get(name, {}),
                "limits": limits[name].limit.as_json(),
                "throttled": limits[name].throttled or bool(held),
                "throttle": _throttle(limits[name], held),
                "held_by_task_limits": [s.path for s in held],
            }
        )
    report = backend.preflight()
    server = {"address": backend.server_address, "summary": report.summary(), "warnings": list(report.warnings)}
    return {"backend": backend.alias, "server": server, "queues": queues, "workers": [_worker(w) for w in workers]}


def _throttle(state, holding) -> str | None:
    """Return what holds a throttled queue back, in words (its limits, else per-task ones); None when nothing does."""
    if not state.throttled:
        if holding:
            return "held by per-task limits: " + ", ".join(s.holding_text() for s in holding)
        return None
    if state.at_concurrency:
        return f"throttled: {state.running}/{state.limit.concurrency} running"
    return f"rate limited, next in {state.next_token_s:.1f} s"


def _worker(document: dict[str, Any]) -> dict[str, Any]:
    fields = ("worker", "state", "queues", "threads", "busy_threads", "tasks_done", "heartbeat_age_s")
    parsed = WorkerName.parse(str(document.get("worker", "")))
    where = {"host": parsed.host, "pid": parsed.pid} if parsed else {"host": None, "pid": None}
    return {name: document.get(name) for name in fields} | where


def render(status: dict[str, Any]) -> str:
    """Return the status as two plain text tables."""
    queue_rows = [["queue", "ready", "deferred", "running", "failed", "unreadable", "latency", "workers", "note"]]
    for q in status["queues"]:
        note = "paused by {by}".format(**q["paused"]) if q["paused"] else "NO LIVE WORKER" if q["unserved"] else ""
        note = note or q["throttle"] or ""
        latency = "-" if q["latency_s"] is None else f"{q['latency_s']:.1f} s"
        queue_rows.append(
            [
                q["queue"],
                q["ready"],
                q["deferred"],
                q["running"],
                q["failed"],
                q["unreadable"],
                latency,
                q["workers"],
                note,
            ]
        )
    worker_rows = [["worker", "state", "queues", "busy", "done", "heartbeat"]]
    for w in status["workers"]:
        busy = f"{w['busy_threads']}/{w['threads']}"
        worker_rows.append(
            [
                w["worker"],
                w["state"],
                ",".join(w["queues"] or ()),
                busy,
                w["tasks_done"],
                f"{w['heartbeat_age_s']:.1f} s ago",
            ]
        )
    if len(worker_rows) == 1:
        worker_rows.append(["(no live worker)", "", "", "", "", ""])
    server = status["server"]
    warnings = "".join(f"\nWarning: {warning}" for warning in server["warnings"])
    head = f"Backend {status['backend']} on {server['address']}\n{server['summary']}{warnings}"
    return f"{head}\n\n{_table(queue_rows)}\n\n{_table(worker_rows)}"


def _table(rows: list[list[Any]]) -> str:
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells
    )
