"""The reference pages list what the code defines, no more and no less (issue 31).

The task options page names exactly the fields of `ThreadmillTask` a user sets, and the exit
codes page exactly the constants of `threadmill.exit_codes`, each with its value. The code's
side is read from the code (the dataclass's fields, the module's names, the syntax tree of the
commands); the docs' side from the tables of the built site (the `site` fixture).
"""

from __future__ import annotations

import ast
import dataclasses
from html.parser import HTMLParser
from pathlib import Path

from django.core.management.base import CommandError

from threadmill import exit_codes
from threadmill.base import ThreadmillTask

ROOT = Path(__file__).resolve().parent.parent
#: Fields of ThreadmillTask no user sets as an option, with the reason.
NOT_OPTIONS = {
    "func": "the decorated function itself: the task, not an option of it",
}
#: Where exit codes are produced: the subcommands, the management command and the worker processes.
EXITING_CODE = [ROOT / "threadmill" / "cli", ROOT / "threadmill" / "management", ROOT / "threadmill" / "worker"]


class _Tables(HTMLParser):
    """The body rows of every table of a built page, each a list of its cells' text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_body = False
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def table_rows(site: Path, page: str) -> list[list[str]]:
    return _Tables((site / page).read_text()).rows


def test_the_task_options_page_names_exactly_the_fields_of_the_task_class_users_set(site):
    documented = [row[0] for row in table_rows(site, "reference/task-options.html")]
    options = {field.name for field in dataclasses.fields(ThreadmillTask)} - set(NOT_OPTIONS)
    assert sorted(documented) == sorted(options)  # sorted lists: an option documented twice fails too


def test_every_field_left_out_of_the_task_options_is_a_field():
    assert set(NOT_OPTIONS) <= {field.name for field in dataclasses.fields(ThreadmillTask)}


def defined_exit_codes() -> dict[str, int]:
    return {name: value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")}


def test_the_exit_codes_page_lists_exactly_the_codes_the_code_defines(site):
    documented = [(row[1], int(row[0])) for row in table_rows(site, "reference/exit-codes.html")]
    assert sorted(documented) == sorted(defined_exit_codes().items())


def test_a_command_error_exits_with_the_documented_error_code():
    assert CommandError("any").returncode == exit_codes.EXIT_ERROR


def bare_exit_codes(source: str, where: str) -> list[str]:
    """Return where `source` exits with, or a subcommand's `handle` returns, a number instead of a named code."""

    def numbers(node: ast.expr | None) -> list[ast.Constant]:
        if isinstance(node, ast.IfExp):
            return numbers(node.body) + numbers(node.orelse)
        return [node] if isinstance(node, ast.Constant) and isinstance(node.value, int) else []

    found: list[ast.Constant] = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in {"exit", "_exit"}:
                found += numbers(node.args[0])
        elif isinstance(node, ast.FunctionDef) and node.name == "handle":
            found += [n for ret in ast.walk(node) if isinstance(ret, ast.Return) for n in numbers(ret.value)]
    return [f"{where}:{number.lineno}" for number in found]


def test_every_exit_code_is_a_named_constant_of_the_exit_codes_module():
    files = [path for folder in EXITING_CODE for path in sorted(folder.rglob("*.py"))]
    assert [where for path in files for where in bare_exit_codes(path.read_text(), str(path.relative_to(ROOT)))] == []


def test_the_bare_exit_code_scan_finds_a_returned_number_and_an_exit_with_one():
    status = (ROOT / "threadmill" / "cli" / "status.py").read_text()
    assert bare_exit_codes(status.replace("else EXIT_OK", "else 0"), "status.py") != []
    command = (ROOT / "threadmill" / "management" / "commands" / "threadmill.py").read_text()
    assert bare_exit_codes(command.replace("self.exit(EXIT_USAGE, ", "self.exit(2, "), "threadmill.py") != []
