"""The preflight's decision (a pure function of INFO) and its one read, against real servers."""

from __future__ import annotations

import pytest
import redis

from tests.proxy import InfoRewritingProxy, version_rewrite
from threadmill.backends.preflight import assess, is_supported, policy_warning, server_name, version_tuple
from threadmill.backends.redis import RedisTaskBackend

ADDRESS = "redis://u:***@h:6379/0"
VALKEY = {"redis_version": "7.2.4", "valkey_version": "8.1.1", "server_name": "valkey"}


@pytest.mark.parametrize(
    ("text", "parsed", "supported"),
    [
        ("7.0.0", (7, 0, 0), True),
        ("6.2.14", (6, 2, 14), False),
        ("7.2.4", (7, 2, 4), True),
        ("255.255.255", (255, 255, 255), True),
        ("6.9.99", (6, 9, 99), False),
        ("7", (7,), True),
        ("7.0.0-rc1", (7, 0, 0), True),
        ("unknown", None, None),
        (None, None, None),
    ],
)
def test_a_version_is_compared_by_its_numbers_with_the_7_0_floor(text, parsed, supported):
    assert version_tuple(text) == parsed
    assert is_supported(text) is supported


def test_valkey_is_named_by_both_its_versions_and_judged_by_its_compatible_redis_version():
    assert server_name(VALKEY) == "Valkey 8.1.1 (redis_version 7.2.4)"
    report = assess({**VALKEY, "maxmemory_policy": "noeviction", "maxmemory": 0, "aof_enabled": 1}, ADDRESS)
    assert (report.refusal, report.warnings, report.aof) == (None, (), True)
    assert report.summary() == (
        "server: Valkey 8.1.1 (redis_version 7.2.4); maxmemory no limit, maxmemory-policy noeviction; "
        "append-only file on"
    )


def test_a_server_whose_used_memory_reached_maxmemory_is_reported_full_and_what_to_do():
    info = {"redis_version": "7.0.15", "maxmemory_policy": "noeviction", "maxmemory": 4096, "aof_enabled": 0}
    assert not assess({**info, "used_memory": 4095}, ADDRESS).full
    assert not assess({**info, "maxmemory": 0, "used_memory": 1 << 30}, ADDRESS).full
    full = assess({**info, "used_memory": 5000}, ADDRESS)
    assert full.full
    assert full.summary() == (
        "server: Redis 7.0.15; maxmemory 4096 bytes, maxmemory-policy noeviction; append-only file off; "
        "full: used memory 5000 of maxmemory 4096 bytes, so enqueues are refused while workers drain "
        "(raise maxmemory, or purge tasks nobody needs)"
    )


def test_a_server_below_the_floor_is_refused_in_one_line_naming_its_version_and_the_floor():
    report = assess({"redis_version": "6.2.14", "maxmemory_policy": "noeviction"}, ADDRESS)
    assert report.refusal == (
        "The server at redis://u:***@h:6379/0 is Redis 6.2.14, below Redis 7.0, the oldest Threadmill supports; "
        "upgrade it to Redis 7.0 or later (or Valkey 7.2 or later)."
    )
    old_valkey = assess({"redis_version": "6.2.4", "valkey_version": "7.0.0"}, ADDRESS)
    assert "is Valkey 7.0.0 (redis_version 6.2.4), below Redis 7.0" in str(old_valkey.refusal)


@pytest.mark.parametrize(
    ("policy", "drops"),
    [
        ("allkeys-lru", "any key: tasks, task results, uniqueness keys and rate tokens"),
        ("allkeys-lfu", "any key: tasks, task results, uniqueness keys and rate tokens"),
        ("allkeys-random", "any key: tasks, task results, uniqueness keys and rate tokens"),
        ("volatile-lru", "keys with a TTL: task results, uniqueness keys"),
        ("volatile-ttl", "keys with a TTL: task results, uniqueness keys"),
        ("volatile-random", "keys with a TTL: task results, uniqueness keys"),
    ],
)
def test_an_evicting_policy_is_warned_about_naming_what_it_may_drop_and_never_refused(policy, drops):
    report = assess({"redis_version": "7.4.1", "maxmemory_policy": policy, "maxmemory": 1 << 30}, ADDRESS)
    assert report.refusal is None
    (warning,) = report.warnings
    assert warning.startswith(
        f"maxmemory-policy is {policy}, not noeviction: at maxmemory the server may evict {drops}"
    )
    assert "Set maxmemory-policy noeviction" in warning
    assert f"maxmemory {1 << 30} bytes, maxmemory-policy {policy}" in report.summary()


def test_noeviction_is_not_warned_about():
    assert policy_warning("noeviction") is None


def test_an_info_refused_says_it_could_not_read_the_policy_and_goes_on():
    report = assess(None, ADDRESS, "INFO is not permitted: no permission")
    assert report.refusal is None and report.policy is None
    (warning,) = report.warnings
    assert warning == (
        "The preflight could not read the policy of the server at redis://u:***@h:6379/0 "
        "(INFO is not permitted: no permission): maxmemory-policy is unchecked."
    )
    assert report.summary() == "server: unknown; could not read the policy"


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_the_backend_reads_a_real_server_s_policy_once(eviction_policy, redis_url, policy):
    eviction_policy(policy)
    backend = RedisTaskBackend("default", {"REDIS_URL": redis_url})
    report = backend.preflight()
    assert report.policy == policy and report.server and report.server.startswith("Valkey ")
    assert report.warnings[0].startswith(f"maxmemory-policy is {policy}")
    eviction_policy("noeviction")
    assert backend.preflight() is report  # once per backend instance: no second INFO


def test_a_user_denied_info_gets_a_report_that_could_not_read_the_policy(password_server):
    admin = redis.Redis.from_url(password_server.url)
    admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw-noinfo-x", "~*", "&*", "+@all", "-info")
    try:
        url = f"redis://noinfo:pw-noinfo-x@127.0.0.1:{password_server.port}/0"
        report = RedisTaskBackend("default", {"REDIS_URL": url}).preflight()
    finally:
        admin.execute_command("ACL", "DELUSER", "noinfo")
        admin.close()
    assert report.policy is None and report.refusal is None
    assert "could not read the policy" in report.warnings[0] and "pw-noinfo-x" not in report.warnings[0]


def test_a_real_server_reporting_an_old_version_through_a_rewriting_proxy_is_refused(redis_url):
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    proxy = InfoRewritingProxy(port, version_rewrite("6.2.14"))
    try:
        report = RedisTaskBackend("default", {"REDIS_URL": proxy.url}).preflight()
    finally:
        proxy.close()
    assert report.server == "Redis 6.2.14"
    assert report.refusal and report.refusal.startswith(f"The server at {proxy.url} is Redis 6.2.14, below Redis 7.0")
