"""`manage.py threadmill <subcommand>`: a dispatcher over the registry in `threadmill.cli`."""

from __future__ import annotations

import sys
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

    def create_parser(self, prog_name: str, subcommand: str, **kwargs) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.__class__ = OneLineParser  # Django builds the parser itself; only its error() changes.
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            dest="subcommand", required=True, metavar="subcommand", parser_class=OneLineParser
        )
        for name, path in SUBCOMMANDS.items():
            module = import_module(path)
            module.add_arguments(subparsers.add_parser(name, help=module.HELP, description=module.HELP))

    def handle(self, *args, subcommand: str, **options) -> None:
        code = import_module(SUBCOMMANDS[subcommand]).handle(self, options)
        if code:
            sys.exit(code)
