"""The shell command lines of the docs, checked against the real programs without running them.

`python manage.py CMD ...` and `django-admin CMD ...` are parsed by the parser of that
management command itself (`threadmill ...` is ours), `python -m MODULE` must be importable and
runnable, `pip install` extras must be the project's, `bash SCRIPT` must exist, any other
program must be in KNOWN_PROGRAMS, and a relative path into this repository must exist.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

from django.core.management import get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError

from tests.docs_blocks import ROOT

#: Programs a shell block may name beyond python, pip, django-admin and bash/sh SCRIPT: ordinary tools.
KNOWN_PROGRAMS = frozenset(
    {"cat", "cd", "chmod", "chown", "cp", "curl", "daphne", "docker", "echo", "export", "git", "install"}
    | {"journalctl", "kill", "kubectl", "ln", "ls", "mkdir", "mv", "redis-cli", "redis-server", "systemctl"}
    | {"tee", "uvicorn", "valkey-cli", "valkey-server"}
)


class CommandProblem(Exception):
    """Raised when a command line names no real program, module, script, command or argument."""


def command_lines(text: str, first_line: int, *, console: bool) -> list[tuple[int, str]]:
    """Return (line number, text) of each command line (a console's: after `$ `), continuations joined."""
    found: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), first_line):
        if pending is None:
            if console:
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            pending = (number, "")
        joined = pending[1] + line
        if joined.endswith("\\"):
            pending = (pending[0], joined[:-1] + " ")
            continue
        found.append((pending[0], joined))
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
            raise CommandProblem(f"names {word}, which is not in the repository")


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
            raise CommandProblem("runs threadmill, which is no program here: write `python manage.py threadmill ...`")
        return check_management_command(["threadmill", *arguments])
    if program in {"bash", "sh"}:
        if not arguments or not (ROOT / arguments[0]).is_file():
            raise CommandProblem(f"runs {' '.join(words)!r}, and there is no such script in the repository")
        return None
    if program not in KNOWN_PROGRAMS:
        raise CommandProblem(
            f"runs {program!r}, which this test does not know; if it is an ordinary tool add it to KNOWN_PROGRAMS "
            "in tests/docs_commands.py, else mark the block `<!-- not run: REASON -->`"
        )
    return None


def check_python(arguments: list[str]) -> None:
    while arguments and arguments[0] in {"-X", "-W"} | {"-u", "-O", "-B", "-E", "-I", "-s", "-S"}:
        arguments = arguments[2:] if arguments[0] in {"-X", "-W"} else arguments[1:]
    if not arguments:
        raise CommandProblem("runs python with nothing to run")
    if arguments[0] == "-m":
        return check_module(arguments[1], arguments[2:])
    if arguments[0] == "-c":
        compile(arguments[1], "<python -c>", "exec")
        return None
    if Path(arguments[0]).name == "manage.py":
        return check_management_command(arguments[1:])
    if not (ROOT / arguments[0]).is_file():
        raise CommandProblem(f"runs python {arguments[0]}, which is not a script in the repository")
    return None


def check_module(module: str, arguments: list[str]) -> None:
    if module == "pip":
        return check_pip(arguments)
    if module == "django":
        return check_management_command(arguments)
    spec = importlib.util.find_spec(module)
    if spec is None or (spec.submodule_search_locations and importlib.util.find_spec(f"{module}.__main__") is None):
        raise CommandProblem(f"runs python -m {module}, which is not an importable, runnable module")
    return None


def check_pip(arguments: list[str]) -> None:
    if not arguments or arguments[0] not in {"install", "uninstall", "download", "wheel", "show", "list", "freeze"}:
        raise CommandProblem(f"runs pip {' '.join(arguments)!r}: not a pip command")
    known = extras()
    for target in arguments[1:]:
        requested = re.fullmatch(r"(?P<base>[^\[]+)\[(?P<extras>[^\]]*)\]", target)
        if requested and (requested["base"] in {".", "threadmill"} or "/" in requested["base"]):
            unknown = sorted({e.strip() for e in requested["extras"].split(",")} - known)
            if unknown:
                raise CommandProblem(
                    f"installs extra(s) {', '.join(unknown)}, not in pyproject.toml ({', '.join(sorted(known))})"
                )


def check_management_command(arguments: list[str]) -> None:
    """Parse `manage.py NAME ARGS` with the parser of the management command NAME itself."""
    if not arguments:
        raise CommandProblem("runs manage.py with no command")
    name, rest = arguments[0], arguments[1:]
    commands = get_commands()
    if name not in commands:
        raise CommandProblem(f"runs manage.py {name}, which is no management command of this site")
    app = commands[name]
    command = app if isinstance(app, BaseCommand) else load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    try:
        parser.parse_args(rest)
    except CommandError as e:
        raise CommandProblem(f"manage.py {' '.join(arguments)}: {e}") from e
    except SystemExit as e:  # --help, --version
        if e.code:
            raise CommandProblem(f"manage.py {' '.join(arguments)} exits {e.code}") from e
