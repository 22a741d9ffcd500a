"""`manage.py threadmill run` as a real process: first login, demo workload, the console served, a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.inspector.live import ROOT, free_port
from tests.output import LineReader

#: Seconds the run command may take to print its URL.
START_TIMEOUT_S = 60.0


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
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.output = LineReader(self.process.stdout)

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
