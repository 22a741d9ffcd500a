"""Every code block of README.md and docs/ runs, parses or names real commands, or says why not (issue 31).

The blocks are found by `tests/docs_blocks.py`: fenced blocks (inside MyST directives too),
`{code-block} LANG` and `{literalinclude}` (the file it shows). What each language gets:

- python: run. The blocks of one page run in order, in one namespace: a page is one story, so a
  later block may use what an earlier one defined. A block splits into files at a comment line
  naming one (`# settings.py`, `# tasks.py`, `# urls.py`, ...).
  - A settings part (`# settings.py`, or an unnamed part made only of imports and assignments
    to UPPERCASE names) runs in the page's settings namespace, which starts as the settings
    `django-admin startproject` writes (so `INSTALLED_APPS += [...]` works as it does in a new
    project). Its INSTALLED_APPS and MIDDLEWARE must import. Its TASKS is validated: each
    backend is built as written (the options parser, limits, schedules, the configuration
    checks), then again with REDIS_URL pointed at the session's Valkey (the Valkey Cluster for
    `CLUSTER: True`), where `check()` must find nothing and the server must answer. Django's own
    backends are built and checked; another package's (a migration guide's old backend) is only
    imported, since it reads settings the block does not show. The rest of the page then runs
    with those TASKS as the settings.
  - `# urls.py`, `# asgi.py`, `# wsgi.py` parts run on top of what startproject writes there.
  - Everything else runs as the code of one module (tasks defined there are module-level), with
    Django configured, the test database open, and the session's Valkey behind the task backends,
    so an enqueue or a read of a result is real. No worker runs.
- pycon: run as a doctest in the same module namespace; each `>>>` line's output must match
  (ELLIPSIS and NORMALIZE_WHITESPACE on).
- sh, bash, shell, zsh (every line) and console (the lines after `$ `): each simple command of a
  line is checked by `tests/docs_commands.py`: `manage.py` and `threadmill` commands go through
  the real parser of the management command, other programs must be known (KNOWN_PROGRAMS there).
- toml, yaml, json, ini/cfg/systemd: parse; a systemd unit's Exec* command lines are checked as
  a sh block's. A Dockerfile (docker, dockerfile): every instruction is one Docker has, and the
  CMD and ENTRYPOINT command lines are checked as a sh block's (RUN lines are the image's build).
- A `{literalinclude}` gets its file's language; a python file is compiled, not run (the tests
  that own it import it).
- Anything else (a block with no language, text, output) carries `<!-- not run: REASON -->` on
  the line directly above its fence. The marked blocks are counted against NOT_RUN_ALLOWED: the
  count may not grow, and when it shrinks the number must come down with it.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import doctest
import importlib.util
import inspect
import json
import re
import sys
import tomllib
import traceback
import types
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import pytest
import yaml
from django.test import override_settings
from django.utils.module_loading import import_string

from tests.docs_blocks import NOT_RUN, PAGES, ROOT, Block, page_blocks
from tests.docs_commands import CommandProblem, check_command, command_lines, simple_commands

#: Blocks marked `<!-- not run: REASON -->`; lower it when one is made to run, never raise it lightly.
#: 5: the ACL server command; the migration guides' cut-over code (two import the project's own task
#: modules, one moves the old backend's rows); the TLS Sentinel settings (they need TLS servers to validate).
NOT_RUN_ALLOWED = 5
PYTHON = {"python", "py", "python3"}
PYCON = {"pycon"}
SHELL = {"sh", "bash", "shell", "zsh"}
CONSOLE = {"console", "shell-session"}
DATA = {"toml", "yaml", "yml", "json", "ini", "cfg", "systemd", "docker", "dockerfile"}
#: Dockerfile instructions (Docker's reference); a line that starts with none is a mistake.
DOCKER_INSTRUCTIONS = {"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK", "LABEL"}
DOCKER_INSTRUCTIONS |= {"MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}
#: A comment line that starts the part of a python block that belongs in the file it names.
FILE_HEADER = re.compile(r"^# (?:\S+/)?(?P<name>[\w.-]+\.py)\b.*$")
#: The files of a new Django project a block may add to (`django-admin startproject`'s templates).
PROJECT_TEMPLATE = Path(django.__file__).parent / "conf" / "project_template" / "project_name"

BLOCKS = [block for page in PAGES for block in page_blocks(page)]
RUN = [block for block in BLOCKS if block.not_run is None]
PYTHON_PAGES = sorted({block.page for block in RUN if block.language in PYTHON | PYCON})


def checked(block: Block) -> bool:
    return block.language in PYTHON | PYCON | SHELL | CONSOLE | DATA


# -- the not-run markers ------------------------------------------------------------------


def test_every_block_is_checked_or_says_why_not():
    unchecked = [
        f"{block}: a block of {'language ' + repr(block.language) if block.language else 'no language'} is not checked;"
        " give it a language this test runs (python, sh, console, toml, yaml, json, ini) or put"
        " `<!-- not run: REASON -->` on the line directly above its fence."
        for block in RUN
        if not checked(block)
    ]
    unchecked += [
        f"{block}: includes {block.source}, which is no file."
        for block in BLOCKS
        if block.source and not block.source.is_file()
    ]
    if unchecked:
        pytest.fail("\n".join(unchecked), pytrace=False)


def test_every_not_run_marker_is_directly_above_a_block_and_gives_a_reason():
    above = {(block.page, block.line - 1) for block in BLOCKS if block.not_run is not None}
    wrong = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if NOT_RUN.match(line) and (page, number) not in above:
                wrong.append(f"{page.relative_to(ROOT)}:{number}: a not-run marker with no fence on the next line.")
    wrong += [f"{block}: the not-run marker gives no reason." for block in BLOCKS if block.not_run == ""]
    if wrong:
        pytest.fail("\n".join(wrong), pytrace=False)


def test_the_blocks_marked_not_run_do_not_grow():
    marked = [f"  {block}: {block.not_run}" for block in BLOCKS if block.not_run is not None]
    listing = "\n".join(marked)
    if len(marked) > NOT_RUN_ALLOWED:
        pytest.fail(
            f"{len(marked)} blocks are marked not run and {NOT_RUN_ALLOWED} may be; make the new one run "
            f"(this test's docstring says what runs) rather than mark it:\n{listing}",
            pytrace=False,
        )
    if len(marked) < NOT_RUN_ALLOWED:
        pytest.fail(
            f"Only {len(marked)} blocks are marked not run now: lower NOT_RUN_ALLOWED in "
            f"tests/{Path(__file__).name} to {len(marked)}.\n{listing}",
            pytrace=False,
        )


# -- python -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """The lines of a python block that belong in one file (`file` None: the block names none)."""

    block: Block
    file: str | None
    first_line: int
    text: str


def parts(block: Block) -> list[Part]:
    found: list[Part] = []
    name, start, lines = None, block.first_line, []
    for number, line in enumerate(block.text.splitlines(), block.first_line):
        header = FILE_HEADER.match(line)
        if header:
            if any(text.strip() for text in lines):
                found.append(Part(block, name, start, "\n".join(lines)))
            name, start, lines = header["name"], number, []
        lines.append(line)
    if any(text.strip() for text in lines):
        found.append(Part(block, name, start, "\n".join(lines)))
    return found


def is_settings(part: Part) -> bool:
    if part.file is not None:
        return part.file == "settings.py"
    try:
        statements = ast.parse(part.text).body
    except SyntaxError:
        return False  # run_part reports it, at its line
    targets = [
        target
        for statement in statements
        for target in (statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)])
    ]
    simple = all(isinstance(s, ast.Import | ast.ImportFrom | ast.Assign | ast.AugAssign) for s in statements)
    return simple and any(targets) and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)


class ExampleFailed(Exception):
    """Raised when a block fails; its message names the file and line."""


def failure(where: str, error: BaseException, source: Path) -> ExampleFailed:
    """Return `error` as one message naming the line of the Markdown (or included) file it came from."""
    line = getattr(error, "lineno", None) if isinstance(error, SyntaxError) else None
    frames = traceback.extract_tb(error.__traceback__)
    ours = [index for index, frame in enumerate(frames) if frame.filename == str(source)]
    if ours:
        line = frames[ours[-1]].lineno  # the block's deepest line in the call chain
    # From the block down: the test's own frames say nothing (nor for a SyntaxError, which shows its line).
    frames = frames[ours[0] :] if ours else []
    at = f"{source.relative_to(ROOT)}:{line}" if line else where
    trace = "".join(traceback.format_list(frames[-10:]) + traceback.format_exception_only(error))
    return ExampleFailed(f"{at} (the block at {where}): {type(error).__name__}: {error}\n\n{trace}")


def run_part(part: Part, namespace: dict[str, Any]) -> None:
    source = part.block.source or part.block.page
    padded = "\n" * (part.first_line - 1) + part.text
    try:
        code = compile(padded, str(source), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        if code.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(code, namespace))
        else:
            exec(code, namespace)  # noqa: S102 - running the docs' code is this test's point
    except Exception as e:
        raise failure(part.block.where, e, source) from e


def run_session(block: Block, namespace: dict[str, Any]) -> None:
    """Run a pycon block as a doctest in the page's module namespace: each `>>>` line's output must match."""
    source = block.source or block.page
    test = doctest.DocTestParser().get_doctest(block.text, namespace, block.where, str(source), block.first_line - 1)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    if runner.failures:
        raise ExampleFailed(f"{block}: {runner.failures} of its examples failed:\n" + "".join(report))


def compile_file(block: Block) -> None:
    assert block.source is not None
    try:
        compile(block.text, str(block.source), "exec", dont_inherit=True)
    except SyntaxError as e:
        raise failure(block.where, e, block.source) from e


def project_file(name: str) -> dict[str, Any]:
    """Return the namespace a new project's `name` leaves (startproject's template run), or an empty module's."""
    template = PROJECT_TEMPLATE / f"{name}-tpl"
    namespace: dict[str, Any] = {"__name__": f"mysite.{name[:-3]}", "__file__": f"/srv/mysite/mysite/{name}"}
    if template.is_file():
        values = {"project_name": "mysite", "secret_key": "docs-example", "django_version": django.get_version()}
        text = re.sub(r"\{\{ (\w+) \}\}", lambda m: values.get(m[1], m[1]), template.read_text())
        exec(compile(text, str(template), "exec"), namespace)  # noqa: S102 - Django's own template
    return namespace


def check_installed(where: str, namespace: dict[str, Any]) -> None:
    """Fail unless every app and middleware the settings name (not `...`, the reader's own) imports."""
    for app in namespace.get("INSTALLED_APPS", []):
        if isinstance(app, str) and importlib.util.find_spec(app.split(".")[0]) is None:
            raise ExampleFailed(f"{where}: INSTALLED_APPS names {app!r}, which does not import.")
    for path in namespace.get("MIDDLEWARE", []):
        if isinstance(path, str):
            try:
                import_string(path)
            except ImportError as e:
                raise ExampleFailed(f"{where}: MIDDLEWARE names {path!r}: {e}") from e


def findings(messages: list) -> None:
    """Raise ValueError naming each system-check message (error or warning) found."""
    if messages:
        raise ValueError("; ".join(f"{m.id}: {m.msg} (hint: {m.hint})" for m in messages))


def live_tasks(where: str, tasks: Any, request) -> dict[str, Any]:
    """Validate a block's TASKS as written and against the session's server; return it pointed there."""
    from threadmill.backends.checks import check_backend
    from threadmill.backends.redis import RedisTaskBackend

    live: dict[str, Any] = {}
    try:
        for alias, params in tasks.items():
            backend_class = import_string(params["BACKEND"])
            live[alias] = params
            if not backend_class.__module__.startswith(("django.", "threadmill.")):
                continue  # another package's (a migration guide's old one): its settings are the reader's
            backend = backend_class(alias, params)
            if not isinstance(backend, RedisTaskBackend):
                findings(backend.check())
                continue
            findings(check_backend(alias, backend.redis_url, backend.config, cluster=backend.cluster))
            url = request.getfixturevalue("cluster").url if backend.cluster else request.getfixturevalue("redis_url")
            live[alias] = {**params, "REDIS_URL": url}
            served = backend_class(alias, live[alias])
            findings(served.check())
            served.server_time()  # the server answers: check() says nothing of one it cannot reach
            served.client.close()
    except Exception as e:
        raise ExampleFailed(f"{where}: its TASKS does not validate: {type(e).__name__}: {e}") from e
    return live


@pytest.mark.django_db
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run(page, request):
    try:
        run_page(page, request)
    except ExampleFailed as e:
        message = str(e)
    else:
        return
    pytest.fail(message, pytrace=False)  # outside the except: the message is the whole report


def run_page(page: Path, request) -> None:
    name = "docs_example_" + re.sub(r"\W", "_", str(page.relative_to(ROOT))[:-3])
    module = types.ModuleType(name)
    settings_namespace = None
    with ExitStack() as stack:
        sys.modules[name] = module
        stack.callback(sys.modules.pop, name, None)
        for block in (block for block in RUN if block.page == page and block.language in PYTHON | PYCON):
            if block.language in PYCON:
                run_session(block, module.__dict__)
                continue
            if block.source is not None:  # a file of the repository: its own tests import it
                compile_file(block)
                continue
            for part in parts(block):
                if is_settings(part):
                    settings_namespace = settings_namespace or project_file("settings.py")
                    before = settings_namespace.get("TASKS")
                    run_part(part, settings_namespace)
                    check_installed(block.where, settings_namespace)
                    if settings_namespace.get("TASKS") is not before:
                        tasks = live_tasks(block.where, settings_namespace["TASKS"], request)
                        stack.enter_context(override_settings(TASKS=tasks))
                elif part.file is not None and (PROJECT_TEMPLATE / f"{part.file}-tpl").is_file():
                    run_part(part, project_file(part.file))
                else:
                    run_part(part, module.__dict__)


# -- shell --------------------------------------------------------------------------------


SHELL_BLOCKS = [block for block in RUN if block.language in SHELL | CONSOLE]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=str)
def test_the_commands_of_a_shell_block_are_real(block):
    lines = command_lines(block.text, block.first_line, console=block.language in CONSOLE)
    if not lines:
        pytest.fail(
            f"{block}: a {block.language} block with no command (a console block's start with `$ `).", pytrace=False
        )
    source = block.source or block.page
    problems = []
    for number, text in lines:
        try:
            for words in simple_commands(text):
                check_command(words)
        except (CommandProblem, ValueError, SyntaxError) as e:
            where = f"{source.relative_to(ROOT)}:{number}"
            problems.append(f"{where}: {e}\n    {text.strip()}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


# -- data ---------------------------------------------------------------------------------


def parse_ini(text: str) -> None:
    configparser.ConfigParser(strict=False, interpolation=None).read_string(text)


def check_unit(block: Block) -> list[str]:
    """Return the problems of a systemd unit's Exec* command lines (ExecStart=, ExecReload=, ...)."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keep the keys as written (ExecStart, not execstart)
    unit.read_string(block.text)
    problems = []
    lines = block.text.splitlines()
    for section in unit.sections():
        for key, value in unit[section].items():
            if not key.startswith("Exec") or not value:
                continue
            number = next((n for n, line in enumerate(lines) if line.strip().startswith(f"{key}=")), 0)
            try:
                for words in simple_commands(value.lstrip("-@+!:")):
                    check_command(words)
            except (CommandProblem, ValueError) as e:
                where = f"{(block.source or block.page).relative_to(ROOT)}:{block.first_line + number}"
                problems.append(f"{where} (the block at {block}): {key}: {e}")
    return problems


PARSERS = {
    "toml": tomllib.loads,
    "yaml": lambda text: list(yaml.safe_load_all(text)),
    "json": json.loads,
    "ini": parse_ini,
}


@pytest.mark.parametrize("block", [block for block in RUN if block.language in DATA], ids=str)
def test_a_data_block_parses(block):
    pytest_fail_without_chain(parse_problems(block))


def parse_problems(block: Block) -> list[str]:
    if block.language in {"docker", "dockerfile"}:
        return check_dockerfile(block)
    language = {"yml": "yaml", "cfg": "ini", "systemd": "ini"}.get(block.language, block.language)
    try:
        PARSERS[language](block.text)
    except (ValueError, yaml.YAMLError, configparser.Error) as e:  # tomllib's and json's errors are ValueErrors
        mark = getattr(e, "problem_mark", None)  # yaml's; json's says lineno
        line = mark.line + 1 if mark else getattr(e, "lineno", None)
        at = f"{(block.source or block.page).relative_to(ROOT)}:{block.first_line + line - 1}" if line else block.where
        return [f"{at} (the block at {block}): the {block.language} does not parse: {e}"]
    return check_unit(block) if block.language == "systemd" else []


def pytest_fail_without_chain(problems: list[str]) -> None:
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def check_dockerfile(block: Block) -> list[str]:
    """Return the problems of a Dockerfile: an unknown instruction, a CMD or ENTRYPOINT that is no real command."""
    problems = []
    source = (block.source or block.page).relative_to(ROOT)
    lines = iter(enumerate(block.text.splitlines(), block.first_line))
    for number, line in lines:
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines, (0, ""))[1]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, value = line.strip().partition(" ")
        heredoc = re.search(r"<<-?[\"']?(\w+)", value)
        while heredoc and next(lines, (0, heredoc[1]))[1].strip() != heredoc[1]:
            pass  # a here-document's lines are its text, not instructions
        try:
            if instruction.upper() not in DOCKER_INSTRUCTIONS:
                raise CommandProblem(f"{instruction} is no Dockerfile instruction")
            if instruction.upper() in {"CMD", "ENTRYPOINT"}:
                exec_form = value.strip().startswith("[")
                for words in [json.loads(value)] if exec_form else simple_commands(value):
                    check_command(words)
        except (CommandProblem, ValueError) as e:
            problems.append(f"{source}:{number} (the block at {block}): {e}")
    return problems
