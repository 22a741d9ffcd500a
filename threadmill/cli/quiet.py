"""`manage.py threadmill quiet WORKER_ID...|--host HOST|--all`: worker processes stop fetching, stay alive."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

from .control import add_target_arguments, send

HELP = "Quiet worker processes: they fetch no more tasks, finish what they hold and stay alive."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    return send(command, options, "quiet")
