"""Sphinx parts generated from the code, so the reference cannot drift from it.

- `threadmill-settings`: a table of every field of the backend's parsed options
  (`threadmill.backends.options.BackendOptions`), its default and its `#:` comment.
- `command_parser()`: the real `manage.py threadmill` parser, for sphinx-argparse.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import import_module

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.pycode import ModuleAnalyzer

OPTIONS_MODULE = "threadmill.backends.options"
OPTIONS_CLASS = "BackendOptions"


def option_docs() -> dict[str, str]:
    """Return each option field's `#:` comment, by field name."""
    found = ModuleAnalyzer.for_module(OPTIONS_MODULE).find_attr_docs()
    return {name: " ".join(lines).strip() for (cls, name), lines in found.items() if cls == OPTIONS_CLASS}


def option_default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return repr(field.default_factory())
    return repr(field.default)


class SettingsTable(Directive):
    """A table of `OPTIONS` keys: name, default and what each sets, from the options dataclass."""

    def run(self) -> list[nodes.Node]:
        options = getattr(import_module(OPTIONS_MODULE), OPTIONS_CLASS)
        docs = option_docs()
        table = nodes.table()
        group = nodes.tgroup(cols=3)
        table += group
        for width in (20, 15, 65):
            group += nodes.colspec(colwidth=width)
        group += nodes.thead("", self._row(["option", "default", "what it sets"]))
        body = nodes.tbody()
        for field in dataclasses.fields(options):
            body += self._row([field.name, option_default(field), docs.get(field.name, "")], literal=2)
        group += body
        return [table]

    @staticmethod
    def _row(cells: list[str], literal: int = 0) -> nodes.row:
        row = nodes.row()
        for index, text in enumerate(cells):
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *([nodes.literal(text, text)] if index < literal else _inline(text)))
            row += entry
        return row


def _inline(text: str) -> list[nodes.Node]:
    """Return `text` as nodes, its `code` spans literal, as the comments in the code write them."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: plain text
        return [nodes.Text(text)]
    return [nodes.literal(part, part) if index % 2 else nodes.Text(part) for index, part in enumerate(parts) if part]


def command_parser():
    """Return the parser of `manage.py threadmill`, built by the management command itself."""
    from threadmill.management.commands.threadmill import Command

    parser = Command().create_parser("manage.py", "threadmill")
    # Django's own options (--settings, --traceback, ...) are Django's documentation's.
    parser.description = re.sub(r"\s+", " ", parser.description or "")
    return parser


def setup(app):
    app.add_directive("threadmill-settings", SettingsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
