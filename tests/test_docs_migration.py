"""The migration guides name only what Threadmill has, and the troubleshooting page quotes only messages it prints.

A guide's mapping table is a Markdown table whose second column is headed "Threadmill". Each
`code span` in that column must be one of these forms, checked against the code:

- `OPTIONS["name"]`: a field of the backend's parsed options (`type(backend.config)`);
- `@task` or `@task(name=…, ...)`: keywords Django's `@task` takes, plus Threadmill's task fields;
- `task.method(…)`, `task.using(name=…)`: an attribute of the task class, a keyword of `using`;
- `result.name`: an attribute of Threadmill's task result;
- `backend.method(…)`: an attribute of the backend class;
- `manage.py threadmill SUB --option ...`: a subcommand and its options, from the real parser;
- `Name(keyword=…)`: a public name of threadmill, `threadmill.retry` or `threadmill.exceptions`, and its keywords;
- `threadmill.dotted.path` or `django.tasks.dotted.path`: something that imports;
- `UPPER_CASE`: a key the backend reads from its `TASKS` entry;
- `Name`: a public name as above.

Anything else is reported as unknown, so a table cannot name a thing this check does not look at.
The troubleshooting page's messages are its block quotes (`> ...`), `…` standing for any text; each
must occur in one string literal of `threadmill/` or `inspector/`, where an f-string's fields read `…`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import shlex
from importlib import import_module
from pathlib import Path

import django.tasks
import django.tasks.backends.base
import pytest
from django.tasks import Task, task_backends

import threadmill
from threadmill import exceptions, retry
from threadmill.backends import redis as redis_backend
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import ThreadmillTask, ThreadmillTaskResult

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "docs" / "how-to" / f"{name}.md" for name in ("from-celery", "from-rq", "from-database-backend")]
TROUBLESHOOTING = ROOT / "docs" / "how-to" / "troubleshooting.md"
#: Where the quoted messages must come from.
CODE_DIRS = [ROOT / "threadmill", ROOT / "inspector"]
#: The fewest characters a quoted message must give besides its `…` (a bare `…` would match anything).
MIN_MESSAGE_TEXT = 12
PLACEHOLDER = "…"
#: What a Threadmill cell says when it names nothing in code.
PLAIN_ANSWERS = ("no equivalent", "the console")


def table_rows(text: str) -> list[list[str]]:
    """Return the cells of every row of the mapping tables in `text` (the tables whose second column is "Threadmill")."""
    rows, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = split_cells(line)
        if not in_table:
            in_table = len(cells) > 1 and cells[1] == "Threadmill"
            continue
        if set(line) <= set("|-: "):
            continue
        rows.append(cells)
    return rows


def split_cells(line: str) -> list[str]:
    """Split a table row at the pipes outside code spans."""
    cells, cell, in_code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*cells, cell.strip()]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def keywords(arguments: str | None) -> list[str]:
    return re.findall(r"(\w+)=", arguments or "")


# -- what the code has -----------------------------------------------------------------


def option_fields() -> set[str]:
    backend = task_backends["default"]
    assert isinstance(backend, RedisTaskBackend)
    return {field.name for field in dataclasses.fields(type(backend.config))}


def task_keywords() -> set[str]:
    django_keywords = set(inspect.signature(django.tasks.task).parameters) - {"function", "kwargs"}
    own = {f.name for f in dataclasses.fields(ThreadmillTask)} - {f.name for f in dataclasses.fields(Task)}
    return django_keywords | own


def public_names() -> dict[str, object]:
    names = {name: getattr(threadmill, name) for name in threadmill.__all__}
    names |= {
        name: value
        for name, value in vars(retry).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == retry.__name__
    }
    names |= {
        name: value
        for name, value in vars(exceptions).items()
        if inspect.isclass(value) and value.__module__ == exceptions.__name__
    }
    return names


def tasks_keys() -> set[str]:
    """Return the keys of a `TASKS` entry that Django or the Threadmill backend reads."""
    sources = [inspect.getsource(module) for module in (django.tasks, django.tasks.backends.base, redis_backend)]
    return {key for source in sources for key in re.findall(r"params(?:\.get\(|\[)\"([A-Z_]+)\"", source)}


def command_options() -> dict[str, set[str]]:
    """Return each `manage.py threadmill` subcommand's option strings, from the parser the command builds."""
    from threadmill.management.commands.threadmill import Command

    parser = Command().create_parser("manage.py", "threadmill")
    subparsers = next(action for action in parser._actions if action.dest == "subcommand")
    return {name: set(sub._option_string_actions) for name, sub in subparsers.choices.items()}


def imports(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def takes_keywords(callable_: object, names: list[str]) -> bool:
    try:
        parameters = inspect.signature(callable_).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return set(names) <= set(parameters)


# -- the forms a Threadmill cell may use -------------------------------------------------


def _option(found: re.Match) -> bool:
    return found[1] in option_fields()


def _task(found: re.Match) -> bool:
    return set(keywords(found[1])) <= task_keywords()


def _task_method(found: re.Match) -> bool:
    attribute = getattr(ThreadmillTask, found[1], None)
    return attribute is not None and (not found[2] or takes_keywords(attribute, keywords(found[2])))


def _result(found: re.Match) -> bool:
    return found[1] in {f.name for f in dataclasses.fields(ThreadmillTaskResult)} or hasattr(
        ThreadmillTaskResult, found[1]
    )


def _backend(found: re.Match) -> bool:
    return hasattr(RedisTaskBackend, found[1])


def _command(found: re.Match) -> bool:
    words = shlex.split(found[1])
    options = command_options().get(words[0])
    return options is not None and all(word in options for word in words[1:] if word.startswith("-"))


def _constructor(found: re.Match) -> bool:
    target = public_names().get(found[1])
    return target is not None and takes_keywords(target, keywords(found[2]))


def _dotted(found: re.Match) -> bool:
    return imports(found[1])


def _tasks_key(found: re.Match) -> bool:
    return found[0] in tasks_keys()


def _public(found: re.Match) -> bool:
    return found[0] in public_names()


#: Form -> its check, tried in order; the first form that matches the whole span decides.
FORMS = [
    (re.compile(r'OPTIONS\["(\w+)"\]'), _option),
    (re.compile(r"@task(?:\((.*)\))?"), _task),
    (re.compile(r"task\.(\w+)(?:\((.*)\))?"), _task_method),
    (re.compile(r"result\.(\w+)(?:\(\))?"), _result),
    (re.compile(r"backend\.(\w+)\(.*\)"), _backend),
    (re.compile(r"(?:python )?(?:manage\.py )?threadmill ([a-z-]+(?: .*)?)"), _command),
    (re.compile(r"((?:threadmill|django\.tasks)(?:\.\w+)+)(?:\(\))?"), _dotted),
    (re.compile(r"(\w+)\((.*)\)"), _constructor),
    (re.compile(r"[A-Z][A-Z_]+"), _tasks_key),
    (re.compile(r"\w+"), _public),
]


def known(name: str) -> bool:
    """Whether a Threadmill cell's code span names something the code has (False for a form not listed)."""
    for form, check in FORMS:
        found = form.fullmatch(name)
        if found:
            return check(found)
    return False


def unknown_names(text: str) -> list[str]:
    """Return the code spans of the Threadmill column of `text`'s mapping tables that name nothing in the code."""
    return [name for row in table_rows(text) for name in code_spans(row[1]) if not known(name)]


def unanswered_rows(text: str) -> list[str]:
    """Return the first cell of each mapping row that neither names something nor says plainly there is none."""
    return [
        row[0] for row in table_rows(text) if not code_spans(row[1]) and not row[1].lower().startswith(PLAIN_ANSWERS)
    ]


# -- the guides ------------------------------------------------------------------------


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: path.stem)
def test_every_name_a_migration_table_gives_exists_in_the_code(guide):
    text = guide.read_text()
    assert len(table_rows(text)) >= 20
    assert unknown_names(text) == []


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: path.stem)
def test_every_row_of_a_migration_table_names_a_threadmill_name_or_says_there_is_none(guide):
    text = guide.read_text()
    assert unanswered_rows(text) == []
    assert any(row[1].startswith("no equivalent") for row in table_rows(text))


def test_a_table_naming_a_wrong_field_fails_the_check():
    wrong = [
        'OPTIONS["visibility_timeout"]',
        "@task(acks_late=…)",
        "@task(run_after=…)",
        "task.using(countdown=…)",
        "task.apply_async(…)",
        "result.traceback",
        "backend.revoke(…)",
        "manage.py threadmill worker --concurrency",
        "manage.py threadmill flower",
        "ExponentialBackoff(retry_backoff=…)",
        "threadmill.retry.LinearBackoff",
        "CELERY_BROKER_URL",
        "SoftTimeLimitExceeded",
        "worker -Q",
    ]
    right = [
        'OPTIONS["lease_ttl"]',
        "@task(timeout=…, rate=…)",
        "task.using(run_after=…)",
        "result.refresh()",
        "backend.cancel(…)",
        "manage.py threadmill worker --queues --exit-empty",
        "ExponentialBackoff(max_retries=…)",
        "threadmill.retry.ExponentialBackoff",
        "REDIS_URL",
        "TaskTimeout",
    ]
    table = "| Old | Threadmill | Notes |\n|---|---|---|\n" + "".join(f"| x | `{name}` | |\n" for name in wrong + right)
    assert unknown_names(table) == wrong


def test_the_table_reader_reads_only_the_threadmill_column_of_mapping_tables():
    text = (
        '| Old | Threadmill | Notes |\n|---|---|---|\n| `OPTIONS["x"]` | no equivalent | `also_not_checked` |\n\n'
        '| a | b |\n|---|---|\n| `OPTIONS["y"]` | `OPTIONS["z"]` |\n'
    )
    assert table_rows(text) == [['`OPTIONS["x"]`', "no equivalent", "`also_not_checked`"]]
    assert unknown_names(text) == []


# -- the troubleshooting page ------------------------------------------------------------


def code_strings() -> list[str]:
    """Return every string literal of the code, an f-string's fields written as `…`."""
    found = []
    for directory in CODE_DIRS:
        for path in directory.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.append(node.value)
                elif isinstance(node, ast.JoinedStr):
                    found.append(
                        "".join(part.value if isinstance(part, ast.Constant) else PLACEHOLDER for part in node.values)
                    )
    return found


def quoted_messages(text: str) -> list[str]:
    return [line[2:].strip() for line in text.splitlines() if line.startswith("> ")]


def missing_messages(messages: list[str], strings: list[str]) -> list[str]:
    """Return the messages no string of `strings` contains, `…` in a message standing for any text."""
    missing = []
    for message in messages:
        parts = message.split(PLACEHOLDER)
        pattern = re.compile(".*?".join(re.escape(part) for part in parts), re.DOTALL)
        if sum(len(part.strip()) for part in parts) < MIN_MESSAGE_TEXT or not any(map(pattern.search, strings)):
            missing.append(message)
    return missing


@pytest.fixture(scope="module")
def strings() -> list[str]:
    return code_strings()


def test_every_message_the_troubleshooting_page_quotes_is_in_the_code(strings):
    messages = quoted_messages(TROUBLESHOOTING.read_text())
    assert len(messages) >= 25
    assert missing_messages(messages, strings) == []


def test_a_quoted_message_the_code_does_not_print_fails_the_check(strings):
    real = "Cannot reach the Redis server: …"
    made_up = [
        "Cannot reach the Valkey server: …",  # one word changed
        "Worker process … exited with status … after … s; respawning it in … s.",
        "… server …",  # too little text to mean anything
    ]
    assert missing_messages([real, *made_up], strings) == made_up
