"""`manage.py threadmill requeue-orphaned [QUEUE...]`: requeue running tasks whose worker is gone or lease overdue."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from ..api import controls
from ..exit_codes import EXIT_OK
from .common import add_backend_argument, known_queues, threadmill_backend

HELP = "Requeue the running tasks whose worker is gone or whose lease is overdue; a live lease is never touched."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queues", nargs="*", metavar="QUEUE", help="Queues to look at (default: every queue).")
    add_backend_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    backend = threadmill_backend(options["backend"])
    for queue_name in known_queues(backend.alias, options["queues"] or None):
        done = controls.requeue_orphaned(backend.alias, queue_name)
        kept = f"; {len(done.skipped)} kept: their lease is live again" if done.skipped else ""
        command.stdout.write(f"{queue_name}: requeued {len(done.moved)} orphaned tasks{kept}. {done.notice}".strip())
    return EXIT_OK
