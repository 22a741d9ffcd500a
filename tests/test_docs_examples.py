"""Every code block of README.md and docs/ runs, parses or names real commands, or says why not (issue 31).

What counts as a block: a fenced block (``` or ~~~, inside MyST directives too), MyST's
`{code-block} LANG`, and a `{literalinclude}` (the file it shows). What each language gets:

- python (and pycon, run as a doctest: each `>>>` line's output must match): run. The blocks of one page run in order, in one namespace: a page is one story, so a
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
- sh, bash, shell, zsh (every line) and console (the lines after `$ `): each simple command of a
  line is checked. `python manage.py CMD ...` and `django-admin CMD ...` are parsed by the real
  parser of that management command (`threadmill ...` is ours); `python -m MODULE` must be
  importable and runnable; `pip install` extras must exist in pyproject.toml; `bash SCRIPT` must
  exist; other programs must be in KNOWN_PROGRAMS; a relative path into this repository must exist.
- A python file shown by `{literalinclude}` is compiled, not run (its own tests import it); a
  data file parses; a shell script's lines are checked as a sh block's.
- toml, yaml, json, ini/cfg/systemd: parse; a systemd unit's Exec* command lines are checked as
  a sh block's.
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
import shlex
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
from django.core.management import get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError
from django.test import override_settings
from django.utils.module_loading import import_string

ROOT = Path(__file__).resolve().parent.parent
#: The pages: the README and the site's sources (not a build or extension folder: docs/_*).
PAGES = [ROOT / "README.md"]
PAGES += sorted(p for p in (ROOT / "docs").rglob("*.md") if not p.relative_to(ROOT / "docs").parts[0].startswith("_"))
#: Blocks marked `<!-- not run: REASON -->`; lower it when one is made to run, never raise it lightly.
NOT_RUN_ALLOWED = 1
#: Programs a shell block may name beyond python, pip, django-admin and bash/sh SCRIPT: ordinary tools.
KNOWN_PROGRAMS = frozenset(
    {"cd", "curl", "daphne", "docker", "export", "git", "journalctl", "kill", "kubectl", "redis-cli"}
    | {"redis-server", "systemctl", "uvicorn", "valkey-cli", "valkey-server"}
)
PYTHON = {"python", "py", "python3"}
PYCON = {"pycon"}
SHELL = {"sh", "bash", "shell", "zsh"}
CONSOLE = {"console", "shell-session"}
DATA = {"toml", "yaml", "yml", "json", "ini", "cfg", "systemd"}
#: The language of a `{literalinclude}` without `:language:`, by the file's suffix.
SUFFIX_LANGUAGE = {".py": "python", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}
SUFFIX_LANGUAGE |= {".ini": "ini", ".cfg": "ini", ".sh": "sh", ".service": "systemd", ".socket": "systemd"}
#: The directives whose content is the code itself; every other directive's content is Markdown to search.
CODE_DIRECTIVES = {"code-block", "code", "sourcecode"}
#: A comment line that starts the part of a python block that belongs in the file it names.
FILE_HEADER = re.compile(r"^# (?:\S+/)?(?P<name>[\w.-]+\.py)\b.*$")
#: The files of a new Django project a block may add to (`django-admin startproject`'s templates).
PROJECT_TEMPLATE = Path(django.__file__).parent / "conf" / "project_template" / "project_name"
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")
DIRECTIVE = re.compile(r"^\{(?P<name>[\w-]+)\}\s*(?P<argument>.*)$")


@dataclass(frozen=True)
class Block:
    """One code block: where its fence is, its language, its text and the not-run reason above it."""

    page: Path
    line: int  #: 1-based line of the opening fence (of the directive for a literalinclude)
    language: str
    text: str
    first_line: int  #: 1-based line of the text's first line in `source`
    not_run: str | None = None
    source: Path | None = None  #: the file the text is from, when it is not the page (a literalinclude)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def __str__(self) -> str:
        return self.where


def is_closing(line: str, fence: str) -> bool:
    stripped = line.strip()
    return len(line) - len(line.lstrip(" ")) < 4 and bool(
        re.fullmatch(re.escape(fence[0]) + f"{{{len(fence)},}}", stripped)
    )


def page_blocks(page: Path) -> list[Block]:
    """Return the code blocks of one Markdown page, in order."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    containers: list[str] = []  # fences of the directives we are inside (their content is Markdown)
    index = 0
    while index < len(lines):
        line = lines[index]
        if containers and is_closing(line, containers[-1]):
            containers.pop()
            index += 1
            continue
        match = FENCE.match(line)
        if not match or (match["fence"][0] == "`" and "`" in match["info"]):
            index += 1
            continue
        fence, info = match["fence"], match["info"].strip()
        marker = NOT_RUN.match(lines[index - 1]) if index else None
        reason = marker["reason"].strip() if marker else None
        directive = DIRECTIVE.match(info)
        if directive and directive["name"] not in CODE_DIRECTIVES | {"literalinclude"}:
            containers.append(fence)
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not is_closing(lines[end], fence):
            end += 1
        body = [text.removeprefix(match["indent"]) for text in lines[index + 1 : end]]
        first = index + 2
        if directive and directive["name"] == "literalinclude":
            found.append(included_block(page, index + 1, directive["argument"], body, reason))
        else:
            words = (directive["argument"] if directive else info).split()
            language = words[0] if words else ""
            while directive and body and re.match(r"^:[\w-]+:", body[0]):  # a code directive's options
                body, first = body[1:], first + 1
            found.append(Block(page, index + 1, language.lower(), "\n".join(body), first, reason))
        index = end + 1
    return found


def included_block(page: Path, line: int, argument: str, options: list[str], reason: str | None) -> Block:
    """Return a `{literalinclude}` as a block of the file it includes (a path from / is from docs/)."""
    source = (ROOT / "docs" / argument.lstrip("/")) if argument.startswith("/") else (page.parent / argument)
    language = next((o.split(":", 2)[2].strip() for o in options if o.startswith(":language:")), "")
    language = language or SUFFIX_LANGUAGE.get(source.suffix, "")
    text = source.read_text() if source.is_file() else ""
    return Block(page, line, language.lower(), text, 1, reason, source.resolve())


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


def command_lines(block: Block) -> list[tuple[int, str]]:
    """Return (line number, text) of each command line, its backslash continuations joined."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in enumerate(block.text.splitlines(), block.first_line):
        if pending is None:
            if block.language in CONSOLE:
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            pending = (number, "")
        text = pending[1] + line
        if text.endswith("\\"):
            pending = (pending[0], text[:-1] + " ")
            continue
        found.append((pending[0], text))
        pending = None
    return found


def simple_commands(text: str) -> list[list[str]]:
    """Split a shell line into its simple commands' words (no operators, redirections or env assignments)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token in {"&&", "||", ";", "|", "&", "(", ")"}:
            commands.append([])
        elif set(token) <= set("<>&") or re.fullmatch(r"\d[<>]&?", token):
            skip = not token.endswith("&")  # a redirection: its target is not a word of the command
        elif not commands[-1] and re.match(r"^[A-Za-z_]\w*=", token):
            check_paths([token.split("=", 1)[1]])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def check_paths(words: list[str]) -> None:
    """Fail on a relative path into this repository (its first part exists here) that does not exist."""
    for word in words:
        word = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if "/" not in word or word.startswith(("-", "/", "~", "$")) or "://" in word or re.search(r"[\[*?{]", word):
            continue
        if (ROOT / word.split("/")[0]).exists() and not (ROOT / word).exists():
            raise ExampleFailed(f"names {word}, which is not in the repository")


def extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_command(words: list[str]) -> None:
    program, arguments = Path(words[0]).name, words[1:]
    if program in {"sudo", "env"}:
        return check_command(arguments)
    check_paths(arguments)
    if re.fullmatch(r"python(3(\.\d+)?)?", program):
        return check_python(arguments)
    if re.fullmatch(r"pip3?", program):
        return check_pip(arguments)
    if program == "django-admin":
        return check_management_command(arguments)
    if program == "threadmill":
        if "threadmill" not in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {}):
            raise ExampleFailed("runs threadmill, which is no program here: write `python manage.py threadmill ...`")
        return check_management_command(["threadmill", *arguments])
    if program in {"bash", "sh"}:
        if not arguments or not (ROOT / arguments[0]).is_file():
            raise ExampleFailed(f"runs {' '.join(words)!r}, and there is no such script in the repository")
        return None
    if program not in KNOWN_PROGRAMS:
        raise ExampleFailed(
            f"runs {program!r}, which this test does not know; if it is an ordinary tool add it to KNOWN_PROGRAMS "
            "in tests/test_docs_examples.py, else mark the block `<!-- not run: REASON -->`"
        )
    return None


def check_python(arguments: list[str]) -> None:
    while arguments and arguments[0] in {"-X", "-W"} | {"-u", "-O", "-B", "-E", "-I", "-s", "-S"}:
        arguments = arguments[2:] if arguments[0] in {"-X", "-W"} else arguments[1:]
    if not arguments:
        raise ExampleFailed("runs python with nothing to run")
    if arguments[0] == "-m":
        return check_module(arguments[1], arguments[2:])
    if arguments[0] == "-c":
        compile(arguments[1], "<python -c>", "exec")
        return None
    if Path(arguments[0]).name == "manage.py":
        return check_management_command(arguments[1:])
    if not (ROOT / arguments[0]).is_file():
        raise ExampleFailed(f"runs python {arguments[0]}, which is not a script in the repository")
    return None


def check_module(module: str, arguments: list[str]) -> None:
    if module == "pip":
        return check_pip(arguments)
    if module == "django":
        return check_management_command(arguments)
    spec = importlib.util.find_spec(module)
    if spec is None or (spec.submodule_search_locations and importlib.util.find_spec(f"{module}.__main__") is None):
        raise ExampleFailed(f"runs python -m {module}, which is not an importable, runnable module")
    return None


def check_pip(arguments: list[str]) -> None:
    if not arguments or arguments[0] not in {"install", "uninstall", "download", "wheel", "show", "list", "freeze"}:
        raise ExampleFailed(f"runs pip {' '.join(arguments)!r}: not a pip command")
    known = extras()
    for target in arguments[1:]:
        requested = re.fullmatch(r"(?P<base>[^\[]+)\[(?P<extras>[^\]]*)\]", target)
        if requested and (requested["base"] in {".", "threadmill"} or "/" in requested["base"]):
            unknown = sorted({e.strip() for e in requested["extras"].split(",")} - known)
            if unknown:
                raise ExampleFailed(
                    f"installs extra(s) {', '.join(unknown)}, not in pyproject.toml ({', '.join(sorted(known))})"
                )


def check_management_command(arguments: list[str]) -> None:
    """Parse `manage.py NAME ARGS` with the parser of the management command NAME itself."""
    if not arguments:
        raise ExampleFailed("runs manage.py with no command")
    name, rest = arguments[0], arguments[1:]
    commands = get_commands()
    if name not in commands:
        raise ExampleFailed(f"runs manage.py {name}, which is no management command of this site")
    app = commands[name]
    command = app if isinstance(app, BaseCommand) else load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(rest)
    except CommandError as e:
        raise ExampleFailed(f"manage.py {' '.join(arguments)}: {e}") from e
    except SystemExit as e:  # --help, --version
        if e.code:
            raise ExampleFailed(f"manage.py {' '.join(arguments)} exits {e.code}") from e


SHELL_BLOCKS = [block for block in RUN if block.language in SHELL | CONSOLE]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=str)
def test_the_commands_of_a_shell_block_are_real(block):
    lines = command_lines(block)
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
        except (ExampleFailed, ValueError, SyntaxError) as e:
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
            except (ExampleFailed, ValueError) as e:
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
