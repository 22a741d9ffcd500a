"""The preflight as commands show it: `manage.py check`, the worker's start, a line of `threadmill status`."""

from __future__ import annotations

import subprocess

import pytest
import redis

from tests.cli.test_status import manage, threadmill
from tests.proxy import InfoRewritingProxy, version_rewrite
from tests.worker.conftest import run_worker, worker_env


def check(**env: str) -> subprocess.CompletedProcess:
    return manage("check", **env)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_manage_py_check_warns_about_an_evicting_policy(eviction_policy, policy):
    eviction_policy(policy)
    done = check()
    assert done.returncode == 0, done.stderr
    assert f"(threadmill.W001) maxmemory-policy is {policy}, not noeviction" in done.stderr
    assert "HINT: Set maxmemory-policy noeviction." in done.stderr


def test_manage_py_check_says_nothing_of_noeviction():
    done = check()
    assert done.returncode == 0 and "maxmemory-policy" not in done.stdout + done.stderr


def test_manage_py_check_of_a_url_that_is_no_redis_url_names_it_without_a_traceback():
    done = check(THREADMILL_TEST_REDIS_URL="http://deploy:pw-not-redis@127.0.0.1:1/0")
    assert done.returncode == 1
    assert "(threadmill.E002) TASKS['default']['REDIS_URL'] is not a redis://" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_the_worker_warns_at_start_about_an_evicting_policy_and_runs(eviction_policy, policy):
    eviction_policy(policy)
    done = run_worker("-w", "1", "-t", "1", "--exit-empty")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "maxmemory-policy" in line]
    assert f"maxmemory-policy is {policy}, not noeviction" in line and "WARNING" in line


def test_status_names_the_server_and_its_policy_on_a_line_and_warns_below_it(eviction_policy):
    eviction_policy("allkeys-lru")
    done = threadmill("status")
    assert done.returncode == 0, done.stderr
    head = done.stdout.splitlines()[:3]
    assert head[1].startswith("server: Valkey ") and "maxmemory-policy allkeys-lru" in head[1]
    assert head[2].startswith("Warning: maxmemory-policy is allkeys-lru, not noeviction")


@pytest.fixture
def no_info_url(password_server):
    """REDIS_URL of a user of the password server who may do everything but INFO."""
    admin = redis.Redis.from_url(password_server.url)
    admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw-noinfo-cli", "~*", "&*", "+@all", "-info")
    yield f"redis://noinfo:pw-noinfo-cli@127.0.0.1:{password_server.port}/0"
    admin.execute_command("ACL", "DELUSER", "noinfo")
    admin.close()


def test_commands_of_a_user_denied_info_say_they_could_not_read_the_policy_and_go_on(no_info_url):
    status = threadmill("status", THREADMILL_TEST_REDIS_URL=no_info_url)
    assert status.returncode == 0, status.stderr
    assert "could not read the policy" in status.stdout
    worker = run_worker("-w", "1", "-t", "1", "--exit-empty", env=worker_env(THREADMILL_TEST_REDIS_URL=no_info_url))
    assert worker.returncode == 0, worker.stderr
    assert "could not read the policy" in worker.stderr and "maxmemory-policy is unchecked" in worker.stderr
    checked = check(THREADMILL_TEST_REDIS_URL=no_info_url)
    assert "(threadmill.W002) The preflight could not read the policy" in checked.stderr
    assert "pw-noinfo-cli" not in status.stdout + worker.stderr + checked.stderr


@pytest.fixture
def old_server(redis_url):
    """The session's Valkey behind a proxy that makes its INFO say Redis 6.2.14; yields the proxy."""
    proxy = InfoRewritingProxy(
        redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"], version_rewrite("6.2.14")
    )
    yield proxy
    proxy.close()


def test_a_server_below_the_floor_is_refused_in_one_line_before_any_write(old_server, redis_url):
    refusal = f"The server at {old_server.url} is Redis 6.2.14, below Redis 7.0, the oldest Threadmill supports"
    for done in (
        threadmill("status", THREADMILL_TEST_REDIS_URL=old_server.url),
        run_worker("-w", "1", "--exit-empty", env=worker_env(THREADMILL_TEST_REDIS_URL=old_server.url)),
    ):
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [
            f"CommandError: {refusal}; upgrade it to Redis 7.0 or later (or Valkey 7.2 or later)."
        ]
    assert redis.Redis.from_url(redis_url).dbsize() == 0  # not even the layout stamp was written
    checked = check(THREADMILL_TEST_REDIS_URL=old_server.url)
    assert checked.returncode == 1 and f"(threadmill.E003) {refusal}" in checked.stderr
