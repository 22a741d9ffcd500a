"""`manage.py threadmill limit QUEUE [--concurrency N] [--rate N/UNIT] [--clear]`: a queue's runtime limits.

Without an option it prints the limits in force. A runtime limit wins over the settings'
(`OPTIONS["limits"]`) until `--clear`; every worker follows it at its next acquire.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..api.controls import LimitError, clear_queue_limit, queue_limits, set_queue_limit
from ..exit_codes import EXIT_OK
from ..limits import QueueLimit
from .common import add_backend_argument, known_queues, threadmill_backend

HELP = "Set, clear or show a queue's concurrency and rate limits (runtime values win over the settings')."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="The queue to limit.")
    parser.add_argument("--concurrency", metavar="N", help="At most N of its tasks leased at once.")
    parser.add_argument("--rate", metavar="N/UNIT", help="At most N leases in any window of one s, m or h.")
    parser.add_argument("--clear", action="store_true", help="Drop the runtime limits: the settings' apply again.")
    add_backend_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    backend = threadmill_backend(options["backend"])
    name, concurrency, rate = options["queue"], options["concurrency"], options["rate"]
    if options["clear"] and (concurrency is not None or rate is not None):
        raise CommandError("--clear takes no --concurrency or --rate.")
    try:
        if options["clear"]:
            had = clear_queue_limit(backend.alias, name)
            limit = queue_limits(backend.alias, [name])[name].limit
            done = "Cleared the runtime limits of" if had else "No runtime limits were set on"
            command.stdout.write(f"{done} queue {name!r}; in force now: {describe(limit)}.")
        elif concurrency is None and rate is None:
            known_queues(backend.alias, [name])
            state = queue_limits(backend.alias, [name])[name]
            set_by = f" (set by {state.set_by})" if state.set_by else ""
            command.stdout.write(f"Queue {name!r}: {describe(state.limit)}{set_by}.")
        else:
            by = f"{getpass.getuser()} (command line)"
            limit = set_queue_limit(backend.alias, name, concurrency=concurrency, rate=rate, by=by)
            command.stdout.write(f"Queue {name!r} is limited to {describe(limit)} until cleared.")
    except LimitError as e:
        raise CommandError(str(e)) from None
    return EXIT_OK


def describe(limit: QueueLimit) -> str:
    """Return the limits as words: "5 running at once, 100/m", or "no limits"."""
    parts = []
    if limit.concurrency is not None:
        parts.append(f"{limit.concurrency} running at once")
    if limit.rate is not None:
        parts.append(f"{limit.rate}")
    return ", ".join(parts) or "no limits"
