"""`manage.py threadmill run`: the whole product on one machine, for a first look or a small site.

Starts the embedded Valkey (unless REDIS_URL is set), migrates the database, creates the
first staff login, enqueues a demo workload, then runs the worker pool and the ASGI server
(daphne) as child processes and prints the console's URL. Ctrl-C or SIGTERM stops the
server, stops the pool within its shutdown timeout (short: this is a development command),
then stops Valkey; the worker processes log which tasks they still wait for. A second
Ctrl-C or SIGTERM stops the children at once (the pool leaves its leases to the broker).
Every child dies with the run: if the run is killed with SIGKILL, the kernel sends each
child SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import import_string

from ..embedded import DEFAULT_EMBEDDED_PORT, EmbeddedValkey, redis_url_from_environment
from ..exceptions import EmbeddedServerError
from ..exit_codes import EXIT_CHILD_EXITED, EXIT_INTERRUPTED, EXIT_OK
from ..lifeline import die_with_parent
from ..redaction import redact_url
from .common import seconds

#: The run's child processes, each with the name its messages give it.
Children = list[tuple[str, subprocess.Popen]]

HELP = "Run the console, a worker pool and (unless REDIS_URL is set) an embedded Valkey, with a demo workload."

#: Default seconds running tasks may take to finish when the run stops: a development server
#: stops at once, and the worker command's 25 s felt like a hang after Ctrl-C.
RUN_SHUTDOWN_TIMEOUT_S = 5.0
#: Seconds the ASGI server may take to listen before the run gives up.
SERVER_START_TIMEOUT_S = 30.0
#: Seconds past the pool's shutdown timeout the children get to exit before a second signal.
GRACEFUL_STOP_MARGIN_S = 5.0
#: Seconds after the second signal before a child's whole process group is killed.
HARD_STOP_TIMEOUT_S = 5.0
#: Seconds between two looks at the children while they stop (a signal ends the wait at once).
STOP_POLL_S = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="Interface the console listens on (default: 127.0.0.1).")
    parser.add_argument("--port", type=int, default=8000, help="Port the console listens on (default: 8000).")
    parser.add_argument("-w", "--workers", type=int, default=1, help="Worker processes (default: 1).")
    parser.add_argument("-t", "--threads", type=int, default=4, help="Threads per worker process (default: 4).")
    parser.add_argument(
        "--shutdown-timeout",
        type=seconds,
        metavar="SECONDS",
        default=RUN_SHUTDOWN_TIMEOUT_S,
        help="Seconds running tasks may take to finish when the run stops, before they are handed back "
        f"(default: {RUN_SHUTDOWN_TIMEOUT_S:g}; the worker command's is longer). A second Ctrl-C stops at once.",
    )
    parser.add_argument(
        "--valkey-port",
        type=int,
        default=DEFAULT_EMBEDDED_PORT,
        help=f"Port of the embedded Valkey when REDIS_URL is unset (default: {DEFAULT_EMBEDDED_PORT}).",
    )
    parser.add_argument(
        "--valkey-dir",
        type=Path,
        default=None,
        help="Data directory of the embedded Valkey (default: var/valkey beside the site).",
    )
    parser.add_argument("--no-demo", action="store_true", help="Do not enqueue the demo workload.")
    parser.add_argument("--no-worker", action="store_true", help="Do not start a worker pool (run one yourself).")


class StopSignals:
    """Ctrl-C and SIGTERM as the run counts them: the first stops the children gently, the second at once.

    The handler only counts: one that took a lock (`Event.set` does) could deadlock the main
    thread it interrupts inside that lock. The interpreter's wakeup fd ends a `pause` at once.
    """

    def __init__(self) -> None:
        self.received = 0
        self._wakeup_read, self._wakeup_write = os.pipe()
        os.set_blocking(self._wakeup_write, False)

    def install(self) -> None:
        """Make SIGINT and SIGTERM count here (from the main thread)."""
        signal.set_wakeup_fd(self._wakeup_write)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._receive)

    def _receive(self, signum: int, frame) -> None:
        self.received += 1

    @property
    def stopping(self) -> bool:
        return self.received >= 1

    @property
    def hurried(self) -> bool:
        return self.received >= 2

    def pause(self, timeout: float) -> None:
        """Wait `timeout` seconds, or less if a signal arrives."""
        if select.select([self._wakeup_read], [], [], timeout)[0]:
            os.read(self._wakeup_read, 512)


def handle(command: BaseCommand, options: dict[str, Any]) -> int:
    """Start everything, print the URL, and wait for Ctrl-C or SIGTERM; return the exit code."""
    if importlib.util.find_spec("daphne") is None:
        raise CommandError("threadmill run serves the console with daphne: pip install 'threadmill[console]'.")
    signals = StopSignals()
    signals.install()
    valkey = _start_valkey(command, options)
    if valkey is not None:
        # Before any backend exists: this process (the demo) and its children use the server just started.
        settings.TASKS["default"]["REDIS_URL"] = valkey.url
    children: Children = []
    try:
        login = _prepare(command, options)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            "REDIS_URL": settings.TASKS["default"].get("REDIS_URL", ""),
        }
        if not options["no_worker"]:
            children.append(("worker pool", _start_worker(options, env)))
        children.append(("ASGI server", _start_server(options, env)))
        _wait_until_listening(options["host"], options["port"], children[-1][1])
        # Last of the start-up, so the URL and the login are what the first screen ends with.
        command.stdout.write(
            f"Threadmill console: http://{options['host']}:{options['port']}/threadmill/  (Ctrl-C stops)"
        )
        command.stdout.write(login)
        code = _wait(command, signals, children, options)
    finally:
        hurried = _stop_children(command, children, options["shutdown_timeout"] + GRACEFUL_STOP_MARGIN_S, signals)
        if valkey is not None:
            valkey.stop()
            command.stdout.write("Embedded Valkey stopped.")
    return EXIT_INTERRUPTED if hurried else code


def _start_valkey(command: BaseCommand, options: dict[str, Any]) -> EmbeddedValkey | None:
    if redis_url_from_environment():
        command.stdout.write(f"Using the Redis server at REDIS_URL ({redact_url(os.environ['REDIS_URL'])}).")
        return None
    data_dir = options["valkey_dir"] or Path(getattr(settings, "BASE_DIR", Path.cwd())) / "var" / "valkey"
    try:
        valkey = EmbeddedValkey(data_dir, options["valkey_port"], stop_with_parent=True).start()
    except EmbeddedServerError as e:
        raise CommandError(str(e)) from None
    command.stdout.write(f"Embedded Valkey listening on {valkey.url} (data in {data_dir}).")
    return valkey


def _prepare(command: BaseCommand, options: dict[str, Any]) -> str:
    """Migrate the database, enqueue the demo and make the first staff user; return the login line to print."""
    db_path = settings.DATABASES["default"].get("NAME")
    if isinstance(db_path, str | Path) and str(db_path) != ":memory:":
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    call_command("migrate", interactive=False, verbosity=0)
    login = _create_first_staff_user()
    if not options["no_demo"]:
        # The site names its demo: the core library never imports the console app.
        path = getattr(settings, "THREADMILL_DEMO_WORKLOAD", None)
        if not path:
            command.stdout.write("No demo workload: the setting THREADMILL_DEMO_WORKLOAD names none.")
            return login
        counts = import_string(path)()
        command.stdout.write("Demo workload enqueued: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + ".")
    return login


def _create_first_staff_user() -> str:
    """Make the first staff user unless there is one; return how to log in."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    username = os.environ.get("THREADMILL_ADMIN_USER") or "admin"
    staff = users.objects.filter(is_staff=True).order_by("pk")
    if existing := (staff.filter(**{users.USERNAME_FIELD: username}).first() or staff.first()):
        # The password was shown once, when the user was created: say how to get back in.
        name = existing.get_username()
        return f"staff user {name!r} exists; set a new password with `manage.py changepassword {name}`"
    password = os.environ.get("THREADMILL_ADMIN_PASSWORD")
    users.objects.create_superuser(username, "", password or (generated := secrets.token_urlsafe(12)))
    if password:
        return f"Created the staff user {username!r} with the password from THREADMILL_ADMIN_PASSWORD."
    return f"Created the staff user {username!r} with password {generated!r} (shown once; keep it)."


def _manage(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args]


def _start_worker(options: dict[str, Any], env: dict[str, str]) -> subprocess.Popen:
    args = _manage(
        "threadmill",
        "worker",
        "-w",
        str(options["workers"]),
        "-t",
        str(options["threads"]),
        "--shutdown-timeout",
        str(options["shutdown_timeout"]),
        "--log-format",
        "text",
    )
    # A session of its own: a terminal's Ctrl-C reaches only this process, which then asks
    # the pool to stop once (a second signal would make the workers drop their tasks).
    return subprocess.Popen(args, env=env, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))  # noqa: PLW1509 - only prctl


def _start_server(options: dict[str, Any], env: dict[str, str]) -> subprocess.Popen:
    module, _, attribute = settings.ASGI_APPLICATION.rpartition(".")
    args = [sys.executable, "-m", "daphne", "-b", options["host"], "-p", str(options["port"]), f"{module}:{attribute}"]
    return subprocess.Popen(args, env=env, start_new_session=True, preexec_fn=die_with_parent(os.getpid()))  # noqa: PLW1509 - only prctl


def _wait_until_listening(host: str, port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise CommandError(f"The ASGI server exited at start (code {server.returncode}); is port {port} free?")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise CommandError(f"The ASGI server did not listen on {host}:{port} within {SERVER_START_TIMEOUT_S:g} s.")


def _wait(command: BaseCommand, signals: StopSignals, children: Children, options: dict[str, Any]) -> int:
    while not signals.stopping:
        signals.pause(0.5)
        for name, child in children:
            if child.poll() is not None:
                command.stderr.write(f"The {name} exited (code {child.returncode}); stopping.")
                return EXIT_CHILD_EXITED
    if options["no_worker"]:
        command.stdout.write("Stopping.")
    else:
        command.stdout.write(
            f"Stopping: running tasks have {options['shutdown_timeout']:g} s to finish; Ctrl-C again stops now."
        )
    return EXIT_OK


def _stop_children(command: BaseCommand, children: Children, graceful_s: float, signals: StopSignals) -> bool:
    """SIGTERM each child; SIGINT to those still busy after `graceful_s` or a second signal; then kill.

    Returns whether a second Ctrl-C or SIGTERM cut the stop short.
    """
    _send(children, signal.SIGTERM)
    _wait_for_exit(children, graceful_s, signals, until_hurried=True)
    hurried = signals.hurried
    if hurried and _running(children):
        command.stdout.write("Stopping now: tasks still running are left to the broker, which requeues them.")
    # The pool's second signal: its processes drop their tasks, and the broker recovers the leases.
    _send(children, signal.SIGINT)
    _wait_for_exit(children, HARD_STOP_TIMEOUT_S, signals, until_hurried=False)
    for name, child in children:
        if child.poll() is None:
            command.stderr.write(f"The {name} did not stop; killing it.")
        # Each child leads a session of its own: nothing of it may outlive the run.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    return hurried


def _running(children: Children) -> Children:
    return [(name, child) for name, child in children if child.poll() is None]


def _send(children: Children, signum: int) -> None:
    for _, child in _running(children):
        child.send_signal(signum)


def _wait_for_exit(children: Children, timeout: float, signals: StopSignals, *, until_hurried: bool) -> None:
    """Wait until every child exited or `timeout` passed, or (`until_hurried`) a second signal came."""
    deadline = time.monotonic() + timeout
    while _running(children) and not (until_hurried and signals.hurried):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        signals.pause(min(left, STOP_POLL_S))
