"""Sentinel with the documented least-privilege user on the data nodes, and a worker killed -9 under it.

The primary and the replica (tests/sentinel.py with `acl`) let the application in only as the
user of docs/how-to/production-redis.md (`keys.ACL_RULES`); the sentinels check a user and a
password of their own, which the backend gets from `OPTIONS["sentinel"]`. A pool in a PID
namespace of its own is killed as a whole (SIGKILL to its pid 1) while it runs a task; the
next pool's broker takes the dead worker's leases back and drains everything, every task
counted on the counter server. Then the primary's ACL LOG (every command, key or login it
refused) is empty. On a set of its own the primary is killed -9 mid-drain: the sentinels,
logged in to the data nodes as their default user, promote the replica, the pool drains on
there as the same limited user, and the promoted replica's ACL LOG is empty too. No output
of any process (the pools' logs, `threadmill status`) shows a password, nor does the log of
a pool given a wrong one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.faults.conftest import (
    FAULT_TIMEOUTS,
    NamespacedPool,
    Tally,
    require_pid_namespaces,
    wait_for,
    wait_for_drain,
)
from tests.sentinel import DataACL, SentinelSet
from tests.worker.conftest import DEADLINE_S, ROOT, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.exceptions import BackendConnectionError

pytestmark = pytest.mark.slow

#: The application's password (in the URL), the data nodes' administrator's, and the sentinels'.
APP_PASSWORD = "app-acl-pw-" + "9d41e7"
ADMIN_PASSWORD = "admin-acl-pw-" + "0b2c88"
SENTINEL_PASSWORD = "sentinel-acl-pw-" + "e6f013"
PASSWORDS = (APP_PASSWORD, ADMIN_PASSWORD, SENTINEL_PASSWORD)
#: Quick tasks drained around the killed one.
TASKS = 30
#: The killed task's first run: far longer than the test, so only the kill ends it.
DOOMED_FIRST_RUN_MS = 60_000
#: Tasks of 20 ms drained across a failover.
FAILOVER_TASKS = 150
#: Longest the next pool may take to give the leases back and drain: worker_timeout 2 s, socket_timeout 1 s.
RECOVERY_TIMEOUT_S = 30.0


def acl_sentinel_set() -> SentinelSet:
    acl = DataACL(password=APP_PASSWORD, admin_password=ADMIN_PASSWORD)
    return SentinelSet(acl=acl, sentinel_user="watcher", sentinel_password=SENTINEL_PASSWORD).start()


@pytest.fixture(scope="module")
def acl_set() -> Iterator[SentinelSet]:
    sentinels = acl_sentinel_set()
    yield sentinels
    sentinels.stop()


@pytest.fixture
def doomed_set() -> Iterator[SentinelSet]:
    """A set of the test's own, whose primary it kills."""
    sentinels = acl_sentinel_set()
    yield sentinels
    sentinels.stop()


@pytest.fixture
def admin(acl_set):
    """An administrator's client of the primary, which starts empty with an empty ACL LOG."""
    acl_set.flush()
    with acl_set.primary_client() as client:
        client.execute_command("ACL", "LOG", "RESET")
        yield client


@pytest.fixture
def start_pool(counter_server) -> Iterator:
    """Start pools on a set (`start_pool(sentinels, *args, **env)`), each in a PID namespace of its own."""
    require_pid_namespaces()
    pools: list[NamespacedPool] = []

    def start(sentinels: SentinelSet, *args: str, **overrides: str) -> NamespacedPool:
        pools.append(NamespacedPool(*args, env={**env(sentinels, counter_server.url), **overrides}))
        return pools[-1]

    yield start
    for pool in pools:
        pool.close()


def env(acl_set: SentinelSet, counter_url: str) -> dict[str, str]:
    """The environment of a pool or a command on the set, with the fault suite's timeouts."""
    return worker_env(
        THREADMILL_TEST_REDIS_URL=acl_set.url,
        THREADMILL_TEST_COUNTER_URL=counter_url,
        THREADMILL_TEST_SENTINEL=json.dumps(acl_set.sentinel_kwargs),
        **FAULT_TIMEOUTS,
    )


def denials(admin) -> list[dict]:
    """The primary's ACL LOG: each command, key, channel or login it refused."""
    return admin.acl_log()


def without_passwords(*outputs: str) -> None:
    for output in outputs:
        for password in PASSWORDS:
            assert password not in output, f"a password shows in:\n{output[-3000:]}"


def test_a_pool_killed_under_the_least_privilege_user_is_recovered_through_sentinel_with_nothing_denied(
    acl_set, admin, counter, counter_server, start_pool
):
    assert acl_set.url.startswith(f"redis+sentinel://threadmill:{APP_PASSWORD}@")
    backend = RedisTaskBackend("default", {"REDIS_URL": acl_set.url, "OPTIONS": {"sentinel": acl_set.sentinel_kwargs}})
    tally = Tally(backend, counter)
    [doomed] = tally.enqueue(1, first_attempt_sleep_ms=DOOMED_FIRST_RUN_MS)
    tally.enqueue(TASKS)
    first = start_pool(acl_set, "-w", "1", "-t", "1")
    wait_for(
        lambda: first.alive() and tally.started()[doomed], lambda: f"the pool starts the task ({tally.summary()})", 20
    )
    first.kill_namespace()
    assert tally.segment_of(doomed) == Segment.RUNNING.value and not tally.finished()[doomed], tally.summary()

    second = start_pool(acl_set, "-w", "1", "-t", "2")
    wait_for_drain(second, tally, RECOVERY_TIMEOUT_S, "the next pool recovers the killed pool's leases and drains")
    assert tally.never_ran() == [] and tally.started()[doomed] == 2, tally.summary()
    assert second.respawns() == []
    status = subprocess.run(
        [sys.executable, "manage.py", "threadmill", "status", "--json"],
        cwd=ROOT,
        env=env(acl_set, counter_server.url),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert status.returncode == 0, status.stderr[-3000:]
    assert json.loads(status.stdout)["server"]["address"].startswith("redis+sentinel://threadmill:***@127.0.0.1:")
    assert denials(admin) == []
    without_passwords(first.output, second.output, status.stdout, status.stderr)


def refusal(pool: NamespacedPool, words: str) -> str:
    """The pool's log once it says `words`, while the pool keeps waiting for the server."""
    return wait_for(
        lambda: pool.alive() and words in pool.output and pool.output, lambda: f"the pool logs {words!r}", 20
    )


def test_a_pool_given_a_wrong_password_logs_the_address_without_any_password(acl_set, admin, start_pool):
    wrong = "wrong-app-pw-" + "5ac1d2"
    pool = start_pool(acl_set, "-w", "1", "-t", "1", THREADMILL_TEST_REDIS_URL=acl_set.url.replace(APP_PASSWORD, wrong))
    output = refusal(pool, "invalid username-password pair")
    assert "Cannot reach the Redis server at redis+sentinel://threadmill:***@127.0.0.1:" in output, output[-3000:]
    assert wrong not in output
    without_passwords(output)
    # The primary's ACL LOG records a refused login, so the empty one of the test above means nothing was refused.
    assert {(entry["reason"], entry["username"]) for entry in denials(admin)} == {("auth", "threadmill")}


def test_a_pool_given_a_wrong_sentinel_password_logs_no_password(acl_set, start_pool):
    wrong = "wrong-sentinel-pw-" + "c4e2b9"
    sentinel = json.dumps({**acl_set.sentinel_kwargs, "password": wrong})
    pool = start_pool(acl_set, "-w", "1", "-t", "1", THREADMILL_TEST_SENTINEL=sentinel)
    output = refusal(pool, "No master found for 'threadmill'")
    assert wrong not in output
    without_passwords(output)


def test_a_primary_killed_mid_drain_under_the_least_privilege_user_fails_over_with_nothing_denied(
    doomed_set, counter, start_pool
):
    backend = RedisTaskBackend(
        "default",
        {"REDIS_URL": doomed_set.url, "OPTIONS": {"sentinel": doomed_set.sentinel_kwargs, "wait_replicas": 1}},
    )
    tally = Tally(backend, counter)
    tally.enqueue(FAILOVER_TASKS, sleep_ms=20)
    pool = start_pool(doomed_set, "-w", "1", "-t", "4", "--prefetch-count", "4")
    wait_for(lambda: pool.alive() and tally.successful() >= 20, lambda: f"a drain is under way ({tally.summary()})", 30)
    replica_port = next(s.port for s in doomed_set.servers if s.port != doomed_set.primary_port())
    doomed_set.kill_primary()
    assert len(tally.finished()) < FAILOVER_TASKS, "the drain ended before the kill: nothing was tested"
    wait_for(lambda: doomed_set.primary_port() == replica_port, lambda: "the sentinels promote the replica", 20)
    # One sentinel may name the new primary while another still answers "no master": the test's
    # own reads (the tally's) wait until the set agrees, as the pool's retries do.
    wait_for(lambda: _answers(backend), lambda: "the test's client finds the promoted primary", 20)
    wait_for_drain(pool, tally, RECOVERY_TIMEOUT_S, "the drain finishes on the promoted replica")
    assert tally.never_ran() == [], tally.summary()
    assert pool.respawns() == []
    with doomed_set.primary_client() as promoted:
        assert promoted.acl_log() == []  # the application's user reached everything it needed there too
    # The pool lost the primary and found the promoted replica without a restart, which is what the kill tested.
    assert "The server answers again after" in pool.output, pool.output[-3000:]
    without_passwords(pool.output)


def _answers(backend: RedisTaskBackend) -> bool:
    try:
        backend.ping()
    except BackendConnectionError:
        return False
    return True
