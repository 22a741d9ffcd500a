"""`manage.py threadmill pause QUEUE`: stop workers taking a queue's tasks; enqueues still land."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import BaseCommand

from ..api import controls
from ..exit_codes import EXIT_OK
from .common import add_backend_argument, known_queues, threadmill_backend

HELP = "Pause a queue: workers take none of its tasks until it is resumed; enqueues still land."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="The queue to pause.")
    add_backend_argument(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    alias = threadmill_backend(options["backend"]).alias
    [queue_name] = known_queues(alias, [options["queue"]])
    if controls.pause_queue(alias, queue_name, by=f"{getpass.getuser()} (command line)"):
        command.stdout.write(f"Paused queue {queue_name!r}: its running tasks finish, no new one starts.")
    else:
        paused = controls.paused_queues(alias)[queue_name]
        command.stdout.write(
            f"Queue {queue_name!r} was already paused by {paused.by} since {paused.since:%Y-%m-%d %H:%M:%S} UTC."
        )
    return EXIT_OK
