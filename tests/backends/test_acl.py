"""The least-privilege ACL of the docs (`keys.ACL_RULES`) runs everything, and the ACL LOG stays empty; `+@all -@dangerous` too, but INFO.

A user with exactly those rules enqueues (one, many, asyncio, unique, deferred), drains with a real
pool, has a worker killed -9 under a running task and recovered by the next pool, cancels, pauses
and resumes, and reads the console's overview, a task page and `threadmill status`; then the server's
ACL LOG, which records every command or key a user was denied, is empty. The rules are printed in
docs/how-to/production-redis.md.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from tests.servers import SERVER_NAMES, start_server
from tests.worker.conftest import ROOT, Worker, run_worker, wait_until, worker_env
from threadmill.backends.keys import ACL_RULES

pytestmark = pytest.mark.slow

#: What a producer and an operator do, run as the limited user in a process of its own.
OPERATIONS = r"""
import asyncio, json, datetime
import django; django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from tests import tasks
from threadmill import api
ids = [tasks.echo.enqueue(i).id for i in range(5)]
ids += [r.id for r in tasks.echo.enqueue_many([((i,), {}) for i in range(5)])]
ids.append(asyncio.run(tasks.echo.aenqueue("async")).id)
ids.append(tasks.unique_echo.enqueue("once").id)
later = tasks.echo.using(run_after=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).enqueue("later")
print(api.actions.cancel("default", [later.id], by="acl test"))
api.controls.pause_queue("default", "emails", by="acl test")
api.controls.resume_queue("default", "emails")
api.overview()
api.task("default", ids[0])
from django.core.management import call_command
call_command("migrate", verbosity=0)
get_user_model().objects.create_superuser("staff", "", "pw")
client = Client(); client.login(username="staff", password="pw")
page = client.get("/threadmill/"); assert page.status_code == 200, (page.status_code, page.content[:300])
print(json.dumps(ids))
# The task the worker killed -9 runs: its id, the last line.
print(tasks.sleep_for.enqueue(1.5).id)
"""


#: The rules a user gets: the documented least-privilege ones, and the common `+@all -@dangerous`,
#: which denies INFO (the preflight's read, @dangerous): that one goes on without it, and its log
#: holds INFO denials and nothing else.
RULES = {
    "documented": (ACL_RULES, set()),
    "all-but-dangerous": ("~threadmill:* &threadmill:* +@all -@dangerous", {"info"}),
}


@pytest.fixture(
    params=[(name, rules) for name in SERVER_NAMES if name in ("valkey", "redis") for rules in RULES],
    ids=lambda param: "-".join(param),
    scope="module",
)
def limited(request):
    """A server of its own whose only enabled user has the rules of `RULES`; yields (its URL, an admin client, the denials allowed)."""
    kind, rules = request.param
    server = start_server(kind)
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "threadmill", "on", ">limited-pw", *RULES[rules][0].split())
    admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">admin-pw")
    admin = redis.Redis(port=server.port, password="admin-pw")
    yield f"redis://threadmill:limited-pw@127.0.0.1:{server.port}/0", admin, RULES[rules][1]
    server.stop()


def denials(admin: redis.Redis) -> list[dict]:
    """The server's ACL LOG, each entry a dict (redis-py parses the reply)."""
    return admin.acl_log()


def test_each_acl_runs_producers_workers_recovery_and_the_console_denied_nothing_it_needs(limited, tmp_path):
    url, admin, allowed = limited
    env = worker_env(
        THREADMILL_TEST_REDIS_URL=url,
        THREADMILL_TEST_DB=str(tmp_path / "db.sqlite3"),
        THREADMILL_TEST_WORKER_TIMEOUT="1",
        THREADMILL_TEST_BROKER_INTERVAL="0.2",
        THREADMILL_TEST_SOCKET_TIMEOUT="1",
    )
    done = subprocess.run([sys.executable, "-c", OPERATIONS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # A worker killed -9 while it runs a task: the next pool's broker recovers the lease and runs it.
    task = done.stdout.split()[-1]
    doomed = Worker("-w", "1", "-t", "1", env=env)
    try:
        wait_until(lambda: admin.zcard("threadmill:{default}:default:running"), "the pool leases the task")
        for pid in [doomed.process.pid, *doomed.children()]:
            os.kill(pid, signal.SIGKILL)
    finally:
        doomed.close()
    # The next pool's broker gives the dead worker's lease back once its heartbeat is worker_timeout old.
    survivor = Worker("-w", "1", "-t", "2", env=env)
    try:
        segment = f"threadmill:{{default}}:task:{task}"
        wait_until(lambda: admin.hget(segment, "segment") == b"successful", "the recovered task runs again")
        assert survivor.stop() == 0, survivor.output[-3000:]
    finally:
        survivor.close()
    drained = run_worker("-w", "1", "-t", "2", "--exit-empty", env=env)
    assert drained.returncode == 0, drained.stderr[-3000:]
    status = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "status", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    assert admin.hget(f"threadmill:{{default}}:task:{task}", "segment") == b"successful"
    denied = denials(admin)
    assert {(entry["reason"], entry["object"]) for entry in denied} <= {("command", name) for name in allowed}, denied
    # The preflight met the denial and went on: the rules really were that narrow.
    assert allowed <= {entry["object"] for entry in denied}, denied


def test_the_production_redis_page_gives_exactly_these_rules():
    page = ROOT / "docs" / "how-to" / "production-redis.md"
    assert f"ACL SETUSER threadmill on >PASSWORD {ACL_RULES}" in page.read_text()
