"""`rediss+sentinel://` for real: a primary, a replica and three sentinels that all serve only TLS.

Every process of the set (tests/sentinel.py with `tls`) listens on a TLS port alone (`port 0`)
and asks each client for a certificate the test's CA signed; the replica and the sentinels
reach the primary over TLS too (`tls-replication yes`), and the sentinels check a user and a
password of their own. The backend gets the sentinels' TLS and credentials from
`OPTIONS["sentinel"]` and the primary's TLS material from `OPTIONS["connection"]`, as
docs/how-to/production-redis.md shows. A pool in a PID namespace of its own drains through
it, `threadmill status` reads it, the console's telemetry subscription goes to the primary,
and no output shows the sentinels' password. Without either half of the TLS material the
primary is not reached at all.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import tasks
from tests.faults.conftest import FAULT_TIMEOUTS, NamespacedPool, require_pid_namespaces
from tests.sentinel import SentinelSet, tls_kwargs
from tests.tls import make_certificates
from tests.worker.conftest import DEADLINE_S, ROOT, worker_env
from threadmill.backends.channel import publish
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import BackendConnectionError, ServerUnreachable

pytestmark = pytest.mark.slow

#: The sentinels' own user and password (`OPTIONS["sentinel"]`), which no output may show.
SENTINEL_USER = "watcher"
SENTINEL_PASSWORD = "sentinel-tls-pw-" + "51c0de"


@pytest.fixture(scope="module")
def tls_set() -> Iterator[SentinelSet]:
    with tempfile.TemporaryDirectory(prefix="threadmill-sentinel-tls-") as folder:
        make_certificates(Path(folder))
        sentinels = SentinelSet(tls=Path(folder), sentinel_user=SENTINEL_USER, sentinel_password=SENTINEL_PASSWORD)
        yield sentinels.start()
        sentinels.stop()


def options(tls_set: SentinelSet) -> dict[str, Any]:
    """OPTIONS as the docs give them: the sentinels' TLS and login, and the primary's TLS material."""
    primary_tls = {name: value for name, value in tls_kwargs(tls_set.tls).items() if name != "ssl"}
    return {"sentinel": tls_set.sentinel_kwargs, "connection": primary_tls, "enqueue_retry": 0}


@pytest.fixture
def on_tls(tls_set) -> RedisTaskBackend:
    tls_set.flush()
    return RedisTaskBackend("default", {"REDIS_URL": tls_set.url, "QUEUES": ["default"], "OPTIONS": options(tls_set)})


def tls_env(tls_set: SentinelSet) -> dict[str, str]:
    """The environment of a process of tests.settings on the TLS set, with the fault suite's short timeouts."""
    config = options(tls_set)
    return worker_env(
        THREADMILL_TEST_REDIS_URL=tls_set.url,
        THREADMILL_TEST_SENTINEL=json.dumps(config["sentinel"]),
        THREADMILL_TEST_CONNECTION=json.dumps(config["connection"]),
        **FAULT_TIMEOUTS,
    )


def status(tls_set: SentinelSet) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "threadmill", "status", "--json"],
        cwd=ROOT,
        env=tls_env(tls_set),
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )


def test_the_url_is_rediss_sentinel_and_every_process_serves_only_tls(tls_set):
    assert tls_set.url.startswith("rediss+sentinel://127.0.0.1:")
    with tls_set.primary_client() as primary:
        assert primary.config_get("port") == {"port": "0"}
        assert primary.info("replication")["connected_slaves"] == 1


def test_check_accepts_the_documented_options_and_reads_the_tls_primary(on_tls):
    assert on_tls.check() == []  # no E004/E005 for the TLS keywords, and the preflight reached the primary
    assert on_tls.preflight().server.startswith("Redis ")  # Debian's redis-server, over TLS


def test_a_pool_in_its_own_pid_namespace_drains_over_tls_and_status_reads_the_primary(on_tls, tls_set):
    require_pid_namespaces()
    ids = [on_tls.enqueue(tasks.echo, [i], {}).id for i in range(10)]
    ids += [asyncio.run(on_tls.aenqueue(tasks.echo, [i], {})).id for i in range(2)]
    pool = NamespacedPool("-w", "1", "-t", "2", "--exit-empty", env=tls_env(tls_set))
    try:
        assert pool.process.wait(DEADLINE_S) == 0, pool.output[-3000:]
        assert {on_tls.get_result(task_id).status.name for task_id in ids} == {"SUCCESSFUL"}
        with tls_set.primary_client() as primary:
            assert primary.dbsize() > 0  # the tasks are on the TLS primary
        # One task and no worker: status says so (exit 1), read over TLS through the sentinels.
        on_tls.enqueue(tasks.echo, ["waiting"], {})
        report = status(tls_set)
        assert report.returncode == 1, report.stderr[-3000:]
        [queue] = [q for q in json.loads(report.stdout)["queues"] if q["queue"] == "default"]
        assert (queue["ready"], queue["unserved"]) == (1, True)
        outputs = pool.output + report.stdout + report.stderr
        assert SENTINEL_PASSWORD not in outputs
        assert "rediss+sentinel://127.0.0.1:" in report.stdout  # the address is shown, its secrets not
    finally:
        pool.close()


def test_the_console_s_telemetry_subscription_goes_to_the_tls_primary(on_tls):
    channel = on_tls.keys.telemetry()
    subscription = on_tls.subscribe_telemetry([channel])
    try:
        publish(on_tls.client, channel, "over tls", sharded=False)
        message = next(filter(None, (subscription.next_message(timeout=0.1) for _ in range(50))), None)
        assert message == (channel, b"over tls")
    finally:
        subscription.close()


def test_sentinels_asked_without_tls_name_no_primary(tls_set):
    sentinel = {name: value for name, value in tls_set.sentinel_kwargs.items() if not name.startswith("ssl")}
    backend = RedisTaskBackend(
        "default", {"REDIS_URL": tls_set.url, "OPTIONS": {**options(tls_set), "sentinel": sentinel}}
    )
    with pytest.raises(ServerUnreachable, match="No master found") as refused:
        backend.enqueue(tasks.echo, ["never"], {})
    assert SENTINEL_PASSWORD not in str(refused.value)


def test_a_primary_reached_without_its_ca_is_refused_in_a_clear_error(tls_set):
    backend = RedisTaskBackend("default", {"REDIS_URL": tls_set.url, "OPTIONS": {**options(tls_set), "connection": {}}})
    with pytest.raises(BackendConnectionError, match="Cannot reach the Redis server") as refused:
        backend.enqueue(tasks.echo, ["never"], {})
    assert SENTINEL_PASSWORD not in str(refused.value)
