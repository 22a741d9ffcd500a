"""`manage.py threadmill status`, `pause` and `resume` as real commands against the session's server."""

from __future__ import annotations

import json
import subprocess
import sys

from django.tasks import task_backends

from tests import tasks
from tests.servers import partition
from tests.worker.conftest import ROOT, worker_env


def threadmill(*args: str, **env: str) -> subprocess.CompletedProcess:
    return manage("threadmill", *args, **env)


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run `manage.py ARGS` to completion with the tests' settings (and `env`), its output captured."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=worker_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _status() -> tuple[int, dict]:
    done = threadmill("status", "--json")
    return done.returncode, json.loads(done.stdout)


def _queue(status: dict, name: str) -> dict:
    return next(q for q in status["queues"] if q["queue"] == name)


def test_status_exits_1_when_ready_tasks_have_no_live_worker():
    tasks.echo.enqueue(1)
    code, status = _status()
    assert code == 1
    default = _queue(status, "default")
    assert (default["ready"], default["workers"], default["unserved"]) == (1, 0, True)
    assert default["latency_s"] >= 0
    assert status["workers"] == []


def test_status_lists_live_workers_by_id_host_and_pid_and_exits_0_when_one_serves_the_queue():
    backend = task_backends["default"]
    tasks.echo.enqueue(1)
    backend.heartbeat("box:42:qmzkfhre", {"type": "worker", "state": "running", "queues": ["default"], "threads": 2})
    backend.heartbeat("old:7", {"type": "worker", "state": "running", "queues": ["emails"], "threads": 1})

    code, status = _status()

    assert code == 0
    assert _queue(status, "default")["workers"] == 1
    new, old = sorted(status["workers"], key=lambda w: w["worker"])
    assert (new["worker"], new["host"], new["pid"], new["threads"]) == ("box:42:qmzkfhre", "box", 42, 2)
    assert (old["worker"], old["host"], old["pid"]) == ("old:7", "old", 7)  # an older release's name
    assert 0 <= new["heartbeat_age_s"] < 5
    text = threadmill("status").stdout
    assert "box:42:qmzkfhre" in text and "old:7" in text and "default" in text


def test_a_paused_queue_shows_who_paused_it_and_does_not_fail_the_status():
    tasks.echo.enqueue(1)
    assert "Paused queue 'default'" in threadmill("pause", "default").stdout

    code, status = _status()

    assert code == 0
    assert "(command line)" in _queue(status, "default")["paused"]["by"]
    assert "paused by" in threadmill("status").stdout
    assert "Resumed queue 'default'" in threadmill("resume", "default").stdout
    assert _queue(_status()[1], "default")["paused"] is None


def test_pausing_an_unknown_queue_is_a_one_line_error_naming_it():
    done = threadmill("pause", "nosuch")
    assert done.returncode == 1
    assert "Unknown queue(s) nosuch" in done.stderr
    assert "Traceback" not in done.stderr


def test_status_shows_a_queue_paused_in_a_partition_a_wider_process_added(settings):
    wide = partition(settings, partitions=3)
    wide.check_layout()
    for i in range(3):
        tasks.echo.enqueue(i)
    wide.pause("default", by="ops")
    # An older release's resume from a process that covered partition 0 alone.
    wide.client.hdel(wide.keys.paused(), "default")

    code, status = _status()

    assert code == 0
    assert _queue(status, "default")["paused"]["by"] == "ops"
    assert "paused by ops" in threadmill("status").stdout
