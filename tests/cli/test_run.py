"""`manage.py threadmill run` as a real process: first login, demo workload, the console served, a clean stop.

Ctrl-C is sent as a terminal sends it: SIGINT to the run's whole process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import redis
from django.tasks import task_backends

from tests.inspector.live import ROOT, free_port
from tests.output import LineReader
from tests.worker.conftest import wait_until
from threadmill.management.commands.threadmill import Command as ThreadmillCommand

#: Seconds the run command may take to print its URL.
START_TIMEOUT_S = 60.0
#: The demo's long-running task (it works for 10 minutes) and its queue.
LONG_TASK, LONG_QUEUE = "inspector.demo.build_report", "reports"
#: Seconds a stopping worker process may take to say what it waits for.
MESSAGE_TIMEOUT_S = 5.0
#: The shutdown timeout of the runs whose stop waits for the demo's long task, seconds.
SHORT_SHUTDOWN_S = 1


class Run:
    """One `threadmill run` process and the lines it printed."""

    def __init__(self, home: Path, redis_url: str, *args: str, **env: str) -> None:
        self.port = free_port()
        environment = {**os.environ, "REDIS_URL": redis_url, "THREADMILL_HOME": str(home), **env}
        environment.pop("DJANGO_SETTINGS_MODULE", None)
        for name in ("THREADMILL_ADMIN_USER", "THREADMILL_ADMIN_PASSWORD"):
            if name not in env:
                environment.pop(name, None)
        command = [sys.executable, "manage.py", "threadmill", "run", "--port", str(self.port), *args]
        # A process group of its own, like a shell's foreground job, so `interrupt` is a terminal's Ctrl-C.
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            process_group=0,
        )
        self.output = LineReader(self.process.stdout)
        self.started: list[psutil.Process] = []

    @property
    def lines(self) -> list[str]:
        return [line.strip() for line in self.output.lines]

    def wait_for_url(self) -> str:
        line = self.output.wait_for("Threadmill console: ", START_TIMEOUT_S)
        if line is None:
            self.process.kill()
            raise AssertionError(f"no URL printed; output: {self.lines}")
        return line.split()[2]

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self.output.wait_closed(10)
        return code

    def interrupt(self) -> None:
        """Press Ctrl-C."""
        os.killpg(self.process.pid, signal.SIGINT)

    def note_descendants(self) -> list[psutil.Process]:
        """Remember every process the run started (the pool, its worker processes, the server); return them."""
        self.started = psutil.Process(self.process.pid).children(recursive=True)
        return self.started

    def survivors(self) -> list[psutil.Process]:
        """The processes the run started that are still alive."""
        return [process for process in self.started if _alive(process)]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        for process in self.started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait(10)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def start_run():
    """Start `threadmill run` processes; whatever of them is left at the end is killed."""
    runs: list[Run] = []

    def start(*args, **kwargs) -> Run:
        runs.append(Run(*args, **kwargs))
        return runs[-1]

    yield start
    for run in runs:
        run.close()


def _wait_until_the_long_task_runs(redis_url: str) -> None:
    """Wait until a worker process runs the demo's long task on a consumer (leased is not enough)."""
    raw, backend = redis.Redis.from_url(redis_url), task_backends["default"]
    key = f"threadmill:{{default}}:{LONG_QUEUE}:running"

    def runs() -> bool:
        leased = {task_id.decode() for task_id in raw.zrange(key, 0, -1)}
        return bool(leased & {task_id for doc in backend.live_workers() for task_id in doc["running"]})

    wait_until(runs, "a worker process runs the demo's long task", START_TIMEOUT_S)


def test_run_creates_the_login_enqueues_the_demo_serves_the_console_and_stops_cleanly(tmp_path, redis_url):
    import redis

    raw = redis.Redis.from_url(redis_url)
    run = Run(tmp_path, redis_url, "--no-worker", THREADMILL_ADMIN_USER="boss", THREADMILL_ADMIN_PASSWORD="s3cret-pw")
    url = run.wait_for_url()
    assert url == f"http://127.0.0.1:{run.port}/threadmill/"
    try:
        response = urllib.request.urlopen(url)  # anonymous: redirected to the login page
    except urllib.error.HTTPError as e:
        pytest.fail(f"the console answered {e.code}")
    assert "/admin/login/" in response.url and response.status == 200
    assert run.stop() == 0
    assert "Created the staff user 'boss' with the password from THREADMILL_ADMIN_PASSWORD." in run.lines
    assert any(line.startswith("Demo workload enqueued: 45 fast, 3 failing, 2 deferred") for line in run.lines)
    assert raw.zcard("threadmill:{default}:default:ready") == 44
    assert raw.zcard("threadmill:{default}:emails:ready") == 5
    assert raw.zcard("threadmill:{default}:reports:deferred") == 2


def test_run_prints_a_generated_password_once(tmp_path, redis_url):
    first = Run(tmp_path, redis_url, "--no-worker", "--no-demo")
    first.wait_for_url()
    assert first.stop() == 0
    created = [line for line in first.lines if line.startswith("Created the staff user 'admin' with password")]
    assert len(created) == 1 and "(shown once; keep it)" in created[0]
    second = Run(tmp_path, redis_url, "--no-worker", "--no-demo")
    second.wait_for_url()
    assert second.stop() == 0
    assert not any("Created the staff user" in line for line in second.lines)
    assert "staff user 'admin' exists; set a new password with `manage.py changepassword admin`" in second.lines


def test_the_first_screen_ends_with_the_url_and_the_login_and_the_demo_failures_take_a_line_each(
    tmp_path, redis_url, start_run
):
    # The demo's long task never finishes: the stop at the end waits out the shutdown timeout.
    run = start_run(tmp_path, redis_url, "--shutdown-timeout", str(SHORT_SHUTDOWN_S))
    run.wait_for_url()
    # The demo's failing tasks fail at once, then retry after a backoff: wait for their first failures.
    failed = "(expected: a demo task)"
    wait_until(
        lambda: sum(failed in line for line in run.lines) >= 3, "the demo's three failing tasks fail", START_TIMEOUT_S
    )
    assert run.stop() == 0
    lines = run.lines
    url_at = next(i for i, line in enumerate(lines) if line.startswith("Threadmill console: "))
    assert lines[url_at + 1].startswith("Created the staff user 'admin' with password")
    # Everything the run command itself prints comes before them (its children log on their own clock).
    assert any(line.startswith("Demo workload enqueued:") for line in lines[:url_at])
    assert not [line for line in lines if line.startswith("Traceback")]
    failures = [line for line in lines if failed in line]
    assert all("ConnectionError: The inventory service of" in line for line in failures)


def test_ctrl_c_names_the_task_it_waits_for_and_stops_everything_within_the_short_shutdown_timeout(
    tmp_path, redis_url, start_run
):
    # One second rather than the default 5 (test_run_stops_within_5_s_by_default...): the run waits it out in full.
    run = start_run(tmp_path, redis_url, "--shutdown-timeout", str(SHORT_SHUTDOWN_S))
    run.wait_for_url()
    _wait_until_the_long_task_runs(redis_url)
    assert len(run.note_descendants()) >= 3  # the pool's supervisor, its worker process, daphne
    pressed = time.monotonic()

    run.interrupt()

    # A demo task's retry may be running beside it at that moment, and is named too.
    told = run.output.wait_for_containing("still running: ", MESSAGE_TIMEOUT_S)
    assert told is not None and LONG_TASK in told, run.lines[-20:]
    assert f"Stopping: running tasks have {SHORT_SHUTDOWN_S} s to finish; Ctrl-C again stops now." in run.lines
    assert run.process.wait(SHORT_SHUTDOWN_S + 4) == 0
    assert time.monotonic() - pressed < SHORT_SHUTDOWN_S + 4
    assert run.survivors() == []
    # Handed back at the timeout as an interrupted attempt, to run again at the next start.
    raw = redis.Redis.from_url(redis_url)
    assert raw.zcard(f"threadmill:{{default}}:{LONG_QUEUE}:ready") == 1


def test_a_second_ctrl_c_stops_everything_at_once(tmp_path, redis_url, start_run):
    run = start_run(tmp_path, redis_url, "--shutdown-timeout", "60")
    run.wait_for_url()
    _wait_until_the_long_task_runs(redis_url)
    run.note_descendants()
    run.interrupt()
    # The pool is stopping: its worker process said so.
    assert run.output.wait_for_containing(" stopping: ", MESSAGE_TIMEOUT_S), run.lines
    pressed = time.monotonic()

    run.interrupt()

    assert run.process.wait(10) == 130
    assert time.monotonic() - pressed < 2
    assert run.survivors() == []
    assert "Stopping now: tasks still running are left to the broker, which requeues them." in run.lines


def test_run_stops_within_5_s_by_default_while_the_worker_command_keeps_25():
    parser = ThreadmillCommand().create_parser("manage.py", "threadmill")

    assert parser.parse_args(["run"]).shutdown_timeout == 5
    assert parser.parse_args(["worker"]).shutdown_timeout == 25


def test_a_bad_shutdown_timeout_is_a_one_line_error(tmp_path, redis_url):
    done = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "run", "--shutdown-timeout", "-1"],
        cwd=ROOT,
        env={**os.environ, "THREADMILL_HOME": str(tmp_path), "REDIS_URL": redis_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().endswith(
        "argument --shutdown-timeout: must be a number of seconds of at least 0, not '-1'"
    )
