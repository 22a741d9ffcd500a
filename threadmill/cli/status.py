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

from .. import api
from ..exit_codes import EXIT_OK, EXIT_UNSERVED
from .common import add_backend_argument, text_table, threadmill_backend

HELP = "Print each queue (counts, latency, paused) and the live workers; exit 1 if ready tasks have no worker."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_backend_argument(parser)
    parser.add_argument("--json", action="store_true", help="Print one JSON object instead of tables.")


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    alias = threadmill_backend(options["backend"]).alias
    status = api.status_report(alias, time.time())
    if options["json"]:
        command.stdout.write(json.dumps(status, indent=2))
    else:
        command.stdout.write(render(status))
    return EXIT_UNSERVED if any(q["unserved"] for q in status["queues"]) else EXIT_OK


def render(status: dict[str, Any]) -> str:
    """Return the status as two plain text tables."""
    queue_rows = [
        ["queue", "waiting", "ready", "deferred", "running", "failed", "unreadable", "latency", "workers", "note"]
    ]
    for q in status["queues"]:
        note = "paused by {by}".format(**q["paused"]) if q["paused"] else "NO LIVE WORKER" if q["unserved"] else ""
        note = note or q["throttle"] or ""
        latency = "-" if q["latency_s"] is None else f"{q['latency_s']:.1f} s"
        queue_rows.append(
            [
                q["queue"],
                q["waiting"],
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
    return f"{head}\n\n{text_table(queue_rows)}\n\n{text_table(worker_rows)}"
