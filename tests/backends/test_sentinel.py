"""A primary found through Redis Sentinel: the URL forms, their checks and redaction, and a real Sentinel set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus

from tests import tasks
from tests.sentinel import SentinelSet
from tests.worker.conftest import run_worker, worker_env
from threadmill.backends.channel import publish
from threadmill.backends.checks import check_url
from threadmill.backends.redis import RedisTaskBackend
from threadmill.backends.sentinel import SentinelURL, parse_sentinel_url
from threadmill.exceptions import ServerUnreachable
from threadmill.redaction import redact_url

# -- the URL ------------------------------------------------------------------------------


def test_a_sentinel_url_names_its_sentinels_service_database_and_the_primary_s_credentials():
    parsed = parse_sentinel_url("redis+sentinel://app:p%40ss@10.0.0.1:26380,10.0.0.2,[::1]:26381/mymaster/3")
    assert parsed == SentinelURL(
        sentinels=(("10.0.0.1", 26380), ("10.0.0.2", 26379), ("::1", 26381)),
        service_name="mymaster",
        db=3,
        username="app",
        password="p@ss",
    )


def test_rediss_sentinel_speaks_tls_to_the_primary_and_the_database_defaults_to_0():
    parsed = parse_sentinel_url("rediss+sentinel://h:1/svc")
    assert (parsed.ssl, parsed.db, parsed.username, parsed.password) == (True, 0, None, None)
    assert parsed.primary_kwargs() == {"db": 0, "ssl": True}


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel://h:1", "names the service"),
        ("redis+sentinel://h:1,/svc", "no empty one"),
        ("redis+sentinel://h:port/svc", "not a number"),
        ("redis+sentinel://h:1/svc/zero", "must be a number"),
        ("redis+sentinel://h:1/svc?ssl=1", "no query"),
    ],
)
def test_an_unreadable_sentinel_url_is_error_e002_saying_why(url, reason):
    backend = RedisTaskBackend("default", {"REDIS_URL": url})
    [error] = [e for e in backend.check() if e.id == "threadmill.E002"]
    assert reason in error.msg
    assert error.hint.startswith("Write it as redis+sentinel://")


def test_e002_accepts_both_sentinel_schemes():
    for url in ("redis+sentinel://127.0.0.1:1/svc/0", "rediss+sentinel://127.0.0.1:1/svc/0"):
        assert check_url("default", url) == []
    assert [e.id for e in check_url("default", "http://127.0.0.1:1/svc/0")] == ["threadmill.E002"]


def test_redact_url_masks_the_password_of_a_sentinel_url():
    url = "redis+sentinel://app:s3cret-pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/0"
    assert redact_url(url) == "redis+sentinel://app:***@10.0.0.1:26379,10.0.0.2:26379/mymaster/0"


def test_cluster_with_a_sentinel_url_is_improperly_configured():
    with pytest.raises(ImproperlyConfigured, match="CLUSTER True and a redis\\+sentinel:// REDIS_URL"):
        RedisTaskBackend("default", {"REDIS_URL": "redis+sentinel://h:1/svc", "CLUSTER": True})


def test_an_unknown_sentinel_keyword_is_error_e005_naming_it():
    options = {"sentinel": {"pasword": "x"}}
    backend = RedisTaskBackend("default", {"REDIS_URL": "redis+sentinel://127.0.0.1:1/svc", "OPTIONS": options})
    [error] = [e for e in backend.check() if e.id == "threadmill.E005"]
    assert "'pasword' is not a keyword argument of redis-py's client of a sentinel" in error.msg


# -- a real Sentinel set ------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[SentinelSet]:
    sentinels = SentinelSet().start()
    yield sentinels
    sentinels.stop()


@pytest.fixture
def on_sentinel(sentinel_set) -> RedisTaskBackend:
    sentinel_set.flush()
    return RedisTaskBackend("default", {"REDIS_URL": sentinel_set.url, "QUEUES": ["default", "emails", "reports"]})


def test_the_thread_path_s_raw_connection_asks_the_sentinels_for_the_primary(on_sentinel, sentinel_set):
    stored = on_sentinel.enqueue(tasks.echo, ["through sentinel"], {})
    assert on_sentinel.get_result(stored.id).status == TaskResultStatus.READY
    assert on_sentinel.scripts.transport.connection().port == sentinel_set.primary_port()


async def test_the_asyncio_path_asks_the_sentinels_for_the_primary(on_sentinel):
    stored = await on_sentinel.aenqueue(tasks.echo, ["on the loop"], {})
    assert (await on_sentinel.aget_result(stored.id)).args == ["on the loop"]


def test_a_worker_pool_drains_through_sentinel(on_sentinel, sentinel_set):
    ids = [on_sentinel.enqueue(tasks.echo, [i], {}).id for i in range(30)]
    done = run_worker("-w", "1", "-t", "2", "--exit-empty", env=worker_env(THREADMILL_TEST_REDIS_URL=sentinel_set.url))
    assert done.returncode == 0, done.stderr[-3000:]
    assert {on_sentinel.get_result(task_id).status for task_id in ids} == {TaskResultStatus.SUCCESSFUL}


def test_the_console_s_telemetry_subscription_goes_to_the_primary(on_sentinel):
    subscription = on_sentinel.subscribe_telemetry([on_sentinel.keys.telemetry()])
    try:
        publish(on_sentinel.client, on_sentinel.keys.telemetry(), "hello", sharded=False)
        message = None
        for _ in range(50):
            message = subscription.next_message(timeout=0.1)
            if message:
                break
        assert message == (on_sentinel.keys.telemetry(), b"hello")
    finally:
        subscription.close()


def test_the_sentinels_own_password_comes_from_options_sentinel():
    sentinels = SentinelSet(sentinel_password="sentinel-pw-" + "7f3a9c").start()
    try:
        url = sentinels.url
        backend = RedisTaskBackend(
            "default", {"REDIS_URL": url, "OPTIONS": {"sentinel": {"password": "sentinel-pw-7f3a9c"}}}
        )
        assert backend.enqueue(tasks.echo, ["let in"], {}).status == TaskResultStatus.READY
        refused = RedisTaskBackend("default", {"REDIS_URL": url, "OPTIONS": {"enqueue_retry": 0}})
        with pytest.raises(ServerUnreachable, match="No master found"):
            refused.enqueue(tasks.echo, ["kept out"], {})
    finally:
        sentinels.stop()
