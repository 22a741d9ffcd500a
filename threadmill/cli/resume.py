"""`manage.py threadmill resume QUEUE`: let workers take a paused queue's tasks again."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from ..api import controls
from ..exit_codes import EXIT_OK
from .common import add_backend_argument, known_queues, threadmill_backend

HELP = "Resume a paused queue: workers take its tasks again."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="The queue to resume.")
    add_backend_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    alias = threadmill_backend(options["backend"]).alias
    [queue_name] = known_queues(alias, [options["queue"]])
    if controls.resume_queue(alias, queue_name):
        command.stdout.write(f"Resumed queue {queue_name!r}.")
    else:
        command.stdout.write(f"Queue {queue_name!r} was not paused.")
    return EXIT_OK
