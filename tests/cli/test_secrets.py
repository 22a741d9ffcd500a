"""No command prints the password of REDIS_URL: status and the worker against a server with a password, up or not."""

from __future__ import annotations

import io
import secrets

from django.core.management.base import BaseCommand, OutputWrapper
from django.tasks import TaskResultStatus

from tests import tasks
from tests.cli.test_status import manage, threadmill
from tests.worker.conftest import run_worker, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.cli import run
from threadmill.embedded import free_port


def printed(done) -> str:
    return done.stdout + done.stderr


def test_status_on_a_server_with_a_password_works_and_prints_no_password(password_server):
    done = threadmill("status", THREADMILL_TEST_REDIS_URL=password_server.url)
    assert done.returncode == 0, printed(done)
    assert done.stdout.startswith(f"Backend default on redis://deploy:***@127.0.0.1:{password_server.port}/0\n")
    assert password_server.password not in printed(done)


def test_status_with_the_server_down_names_the_address_without_its_password(password_server):
    done = threadmill("status", THREADMILL_TEST_REDIS_URL=password_server.url_with(port=free_port()))
    assert done.returncode == 1
    assert "Cannot reach the Redis server at redis://deploy:***@127.0.0.1:" in done.stderr
    assert password_server.password not in printed(done)


def test_status_refused_for_a_wrong_password_does_not_print_that_password(password_server):
    wrong = "pw-" + secrets.token_hex(12)
    done = threadmill("status", THREADMILL_TEST_REDIS_URL=password_server.url_with(password=wrong))
    assert done.returncode == 1
    assert "redis://deploy:***@127.0.0.1:" in done.stderr and "invalid username-password pair" in done.stderr
    assert wrong not in printed(done)


def test_a_worker_that_cannot_reach_its_server_at_start_prints_no_password(password_server):
    url = password_server.url_with(port=free_port())
    done = run_worker("--wait-for-server", "1", env=worker_env(THREADMILL_TEST_REDIS_URL=url))
    assert done.returncode == 1
    assert "Trying again for up to 1 s." in done.stderr and "(tried for 1 s)." in done.stderr
    assert password_server.password not in printed(done)


def test_a_worker_run_on_a_server_with_a_password_prints_no_password(password_server):
    backend = RedisTaskBackend("default", {"REDIS_URL": password_server.url})
    result = backend.enqueue(tasks.echo, ["through the password"], {})
    env = worker_env(THREADMILL_TEST_REDIS_URL=password_server.url)
    done = run_worker("-w", "1", "-t", "1", "--exit-empty", env=env)
    assert done.returncode == 0, printed(done)
    assert backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert password_server.password not in printed(done)


def test_threadmill_run_names_the_server_of_redis_url_without_its_password(password_server, monkeypatch):
    monkeypatch.setenv("REDIS_URL", password_server.url)
    out = io.StringIO()
    command = BaseCommand(stdout=out)
    command.stdout = OutputWrapper(out)
    assert run._start_valkey(command, {}) is None
    assert (
        out.getvalue().strip() == f"Using the Redis server at REDIS_URL ({password_server.url_with(password='***')})."
    )


def test_a_password_with_a_raw_question_mark_is_a_clear_error_that_prints_none_of_it(password_server):
    # urllib reads "deploy:pw..." (up to the "?") as host:port, so redis-py's own error quotes that piece.
    before, after = "pw" + secrets.token_hex(6), secrets.token_hex(6)
    url = f"redis://deploy:{before}?{after}@127.0.0.1:{password_server.port}/0"
    pieces = [before, after]
    for command in (("status",), ("worker", "--exit-empty")):
        done = threadmill(*command, THREADMILL_TEST_REDIS_URL=url)
        assert done.returncode == 1, printed(done)
        assert "cannot be read: its port is not a number. Percent-encode a '?'" in done.stderr, printed(done)
        assert "Traceback" not in printed(done)
        assert not any(piece in printed(done) for piece in pieces), printed(done)
    checked = manage("check", THREADMILL_TEST_REDIS_URL=url)
    assert "(threadmill.E002)" in checked.stderr and "Traceback" not in printed(checked), printed(checked)
    assert not any(piece in printed(checked) for piece in pieces), printed(checked)
