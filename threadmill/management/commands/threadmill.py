"""`manage.py threadmill <subcommand>`: a dispatcher over the registry in `threadmill.cli`.

A command line that names a subcommand builds the parser of that one alone, so it imports
no other subcommand's module (`manage.py threadmill worker` loads no console action); one
that names none (`--help`, a typo) and `call_command` build them all. From the command line, the cyclic garbage collector is paused while the parser is built,
which imports the subcommands' modules (for the worker: redis-py, the backend and the pool),
and what they allocated is then frozen out of later collections (`gc.freeze`), before the
worker forks its processes as Python's documentation advises. `call_command` leaves the
collector alone: its caller's objects are not ours to freeze.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator
from importlib import import_module

from django.core.management.base import BaseCommand, CommandError, CommandParser

from threadmill.cli import SUBCOMMANDS
from threadmill.exit_codes import EXIT_USAGE


class OneLineParser(CommandParser):
    """An argument parser whose errors are one line on stderr, without the usage block."""

    def error(self, message: str):
        if self.called_from_command_line:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
        raise CommandError(f"Error: {message}")


class Command(BaseCommand):
    help = "Run Threadmill: " + ", ".join(SUBCOMMANDS) + "."
    # The worker checks its own backend; the project's checks would only slow every start.
    requires_system_checks = ()
    #: The command line's words after `manage.py threadmill`; None under `call_command`.
    _words: list[str] | None = None

    def run_from_argv(self, argv: list[str]) -> None:
        self._words = argv[2:]
        super().run_from_argv(argv)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs) -> CommandParser:
        with _collector_paused(getattr(self, "_called_from_command_line", False)):
            parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineParser  # Django builds the parser itself; only its error() changes.
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            dest="subcommand", required=True, metavar="subcommand", parser_class=OneLineParser
        )
        for name, path in self._subcommands_to_parse().items():
            module = import_module(path)
            module.add_arguments(subparsers.add_parser(name, help=module.HELP, description=module.HELP))

    def _subcommands_to_parse(self) -> dict[str, str]:
        """Return the subcommand the command line names (the first known word), or every one when it names none."""
        named = next((word for word in self._words or () if word in SUBCOMMANDS), None)
        return SUBCOMMANDS if named is None else {named: SUBCOMMANDS[named]}

    def handle(self, *args, subcommand: str, **options) -> None:
        code = import_module(SUBCOMMANDS[subcommand]).handle(self, options)
        if code:
            sys.exit(code)


@contextlib.contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Pause the cyclic garbage collector for the block, then freeze what survived it (when `pause`)."""
    if not pause or not gc.isenabled():
        yield
        return
    # The imports allocate long-lived objects only (modules, classes, functions): the young
    # collections they set off freed next to nothing and took 20 to 40 ms of a worker's start.
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
