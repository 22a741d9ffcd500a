"""`manage.py threadmill stop WORKER_ID...|--host HOST|--all`: stop worker processes for good, the bounded way."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from .control import add_target_arguments, send

HELP = "Stop worker processes the bounded way (as on SIGTERM); their supervisors do not replace them."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    return send(command, options, "stop")
