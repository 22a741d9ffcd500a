"""`manage.py threadmill cancel ID...`: cancel tasks by id; a running one is asked to abort."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from ..api import CancelOutcome, actions, default_canceller
from ..exit_codes import EXIT_NOT_CANCELLED, EXIT_OK
from .common import add_backend_argument, threadmill_backend

HELP = "Cancel tasks by id: a waiting, ready or deferred one never runs, a running one is asked to abort."

#: The line printed for each outcome, after the task id.
SAYS = {
    CancelOutcome.CANCELLED: "cancelled; it will not run.",
    CancelOutcome.ABORT_REQUESTED: "running; its worker was asked to abort it.",
    CancelOutcome.ALREADY_FINISHED: "already finished; nothing changed.",
    CancelOutcome.UNKNOWN: "no such task.",
    CancelOutcome.UNREADABLE: "unreadable (quarantined); it cannot be cancelled.",
    CancelOutcome.KEPT_MOVING: "kept moving while being cancelled; nothing changed, try again.",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_ids", nargs="+", metavar="ID", help="Ids of the tasks to cancel.")
    add_backend_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    backend = threadmill_backend(options["backend"])
    outcomes = actions.cancel(backend.alias, options["task_ids"], by=f"{default_canceller()} (command line)")
    for task_id, outcome in outcomes.items():
        command.stdout.write(f"{task_id}: {SAYS[outcome]}")
    return EXIT_OK if all(outcome.took for outcome in outcomes.values()) else EXIT_NOT_CANCELLED
