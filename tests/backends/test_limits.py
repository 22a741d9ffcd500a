"""Per-queue concurrency and rate limits, enforced by acquire; runtime values win over the settings'."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from tests.backends.conftest import enqueue, finish, same_server
from tests.tasks import echo, send_email
from threadmill.backends.options import parse_options
from threadmill.backends.partitions import partition_of
from threadmill.backends.redis import RedisTaskBackend
from threadmill.limits import LimitError, QueueLimit, Rate, parse_rate, share


def _drain(backend, *queues: str, count: int = 50) -> list:
    """Acquire until a call leases nothing (one acquire takes from one partition); return every lease."""
    leased = []
    while batch := backend.acquire(*queues, count=count, worker="w:1"):
        leased += batch
    return leased


def test_acquire_leases_no_more_than_the_concurrency_limit_and_an_acknowledgement_frees_a_slot(backend):
    backend.set_limit("default", concurrency=3, by="alice")
    for i in range(10):
        enqueue(backend, echo, i)

    leased = _drain(backend, "default")

    assert len(leased) == 3
    held = backend.acquire("default", count=5, worker="w:1")
    assert held == [] and held.held_back and held.next_token_s is None
    assert finish(backend, leased[0])
    assert len(_drain(backend, "default")) == 1


def test_a_throttled_queue_never_starves_its_neighbour_in_the_same_acquire(backend):
    backend.set_limit("default", concurrency=3)
    for i in range(10):
        enqueue(backend, echo, i)
    emails = {enqueue(backend, send_email, f"{i}@example.com").id for i in range(5)}

    leased = _drain(backend, "default", "emails", count=20)

    assert {r.id for r in leased if r.task.queue_name == "emails"} == emails
    assert len([r for r in leased if r.task.queue_name == "default"]) == 3


def test_a_rate_admits_its_burst_then_says_when_the_next_token_comes(backend):
    backend.set_limit("default", rate=parse_rate("3/m"))
    for i in range(6):
        enqueue(backend, echo, i)

    assert len(_drain(backend, "default")) == 3
    held = backend.acquire("default", count=5, worker="w:1")
    assert held == [] and held.held_back
    assert 59 < held.next_token_s <= 60
    state = backend.queue_limits(["default"])["default"]
    assert state.throttled and 59 < state.next_token_s <= 60


def test_an_acknowledgement_that_frees_a_slot_of_a_held_back_queue_pushes_a_wake_token(backend, raw, server):
    backend.set_limit("default", concurrency=3)
    for i in range(6):
        enqueue(backend, echo, i)
    leased = _drain(backend, "default")
    assert backend.acquire("default", count=5, worker="w:1").held_back
    wake = backend.keys_for(partition_of(leased[0].id)).wake("default")
    client = server.client_for(wake)
    client.delete(wake)  # An idle worker took the token and found the queue held back.

    finish(backend, leased[0])

    assert client.llen(wake) == 1


def test_a_retry_with_a_delay_that_frees_a_slot_of_a_held_back_queue_pushes_a_wake_token(backend, raw, server):
    backend.set_limit("default", concurrency=1)
    for i in range(2):
        enqueue(backend, echo, i)
    [leased] = _drain(backend, "default")
    assert backend.acquire("default", count=5, worker="w:1").held_back
    wake = backend.keys_for(partition_of(leased.id)).wake("default")
    client = server.client_for(wake)
    client.delete(wake)  # An idle worker took the token and found the queue held back.

    assert backend.requeue(leased, run_after=timedelta(minutes=1))

    assert client.llen(wake) == 1
    assert backend.get_result(leased.id).status == "READY"  # deferred: Django's READY
    assert len(_drain(backend, "default")) == 1


def _output_bytes(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def test_queue_limits_reads_one_lease_time_of_a_rate_of_thousands(backend, raw):
    backend.set_limit("default", rate=parse_rate("5000/m"))
    enqueue(backend, echo, 1)
    seconds, microseconds = raw.time()
    now = seconds + microseconds / 1e6
    spent = [now - 30 + 29.9 * i / 4999 for i in range(5000)]  # the oldest 30 s ago, newest first once pushed
    times = backend.keys.lease_times("default")
    raw.lpush(times, *(f"{t:.6f}" for t in spent))

    before = _output_bytes(raw)
    state = backend.queue_limits(["default"])["default"]
    read = _output_bytes(raw) - before

    assert state.throttled and 29 < state.next_token_s <= 30  # the 5000th newest comes back in 30 s
    assert read < 20_000, f"{read} bytes sent for 5,000 lease times of about 24 bytes each"
    raw.rpop(times)  # 4,999 spent: one token left
    assert backend.queue_limits(["default"])["default"].next_token_s is None
    raw.rpush(times, f"{now - 61:.6f}")  # one more, spent over a minute ago: still one left
    assert not backend.queue_limits(["default"])["default"].throttled


def test_a_runtime_limit_wins_over_the_setting_until_cleared(backend, server):
    limited = RedisTaskBackend(
        "default",
        same_server(
            backend,
            QUEUES=["default"],
            OPTIONS={**_partitions(server), "limits": {"default": {"concurrency": 3, "rate": "600/m"}}},
        ),
    )
    for i in range(12):
        enqueue(limited, echo, i)
    assert len(_drain(limited, "default")) == 3

    assert limited.set_limit("default", concurrency=6, by="bob") == QueueLimit(6, Rate(600, "m"))
    assert len(_drain(limited, "default")) == 3
    state = limited.queue_limits(["default"])["default"]
    assert (state.limit, state.running, state.set_by, state.throttled) == (
        QueueLimit(6, Rate(600, "m")),
        6,
        "bob",
        True,
    )

    assert limited.clear_limit("default") is True
    assert limited.queue_limits(["default"])["default"].limit == QueueLimit(3, Rate(600, "m"))
    assert limited.clear_limit("default") is False


def _partitions(server) -> dict:
    return {"partitions": server.partitions} if server.partitions > 1 else {}


def test_shares_of_a_limit_add_up_to_it_and_differ_by_at_most_one():
    for total in (3, 4, 5, 100):
        shares = [share(total, p, 3) for p in range(3)]
        assert sum(shares) == total and max(shares) - min(shares) <= 1


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"emails": {"rate": "5/x"}},
            "['limits']['emails']: A rate is N/s, N/m or N/h with N a whole number, not '5/x'.",
        ),
        ({"emails": {"concurrency": -1}}, "A concurrency limit is a whole number of at least 1, not -1."),
        (
            {"emails": {"concurrency": 2, "burst": 3}},
            "Unknown limit(s) 'burst'; the limits are 'concurrency' and 'rate'.",
        ),
        ({"emails": 5}, "A queue's limits are a dict with 'concurrency' and/or 'rate', not 5."),
        ("5/s", "must map queue names to their limits, not '5/s'."),
    ],
)
def test_bad_limits_in_the_settings_name_the_problem(limits, message):
    with pytest.raises(ImproperlyConfigured) as caught:
        parse_options("default", {"limits": limits})
    assert message in str(caught.value)


def test_a_limit_below_the_partition_count_and_a_limit_on_an_unknown_queue_are_refused():
    with pytest.raises(ImproperlyConfigured, match="A concurrency limit of 2 is below the 3 partitions"):
        parse_options("default", {"partitions": 3, "limits": {"emails": {"concurrency": 2}}})
    with pytest.raises(ImproperlyConfigured, match=r"names queue\(s\) nope that are not in QUEUES"):
        RedisTaskBackend(
            "default",
            {"REDIS_URL": "redis://x", "QUEUES": ["default"], "OPTIONS": {"limits": {"nope": {"rate": "1/s"}}}},
        )
    with pytest.raises(LimitError, match="A rate allows 1 to 100,000 per unit, not 0."):
        parse_rate("0/s")


def test_a_runtime_limit_reaches_the_partitions_a_wider_process_adds(redis_url):
    narrow = RedisTaskBackend("default", {"REDIS_URL": redis_url, "QUEUES": ["default"]})
    narrow.set_limit("default", concurrency=6, by="ops")
    wide = RedisTaskBackend("default", {"REDIS_URL": redis_url, "QUEUES": ["default"], "OPTIONS": {"partitions": 3}})
    wide.record_partitions()
    for i in range(12):
        enqueue(wide, echo, i)

    assert len(_drain(wide, "default")) == 6
    assert wide.queue_limits(["default"])["default"].throttled
