"""The charts' read of a queue's day: the last hour per minute, older quarter-hours from one summary key each."""

from __future__ import annotations

import random
import time

import pytest

from threadmill.api.history import History
from threadmill.backends.tooling.history import SUMMARY_GRACE_MINUTES

#: The key reads a queue's day cost before summaries: 24 hours of 4 per-minute counters.
PER_MINUTE_KEYS = 24 * 60 * 4


def write_counters(backend, minutes, seed: int = 7) -> None:
    """Write random in/out/failed counters and latency samples to `minutes` of the default queue, each partition."""
    rng = random.Random(seed)
    for partition in backend.covered_partitions():
        keys, pipe = backend.keys_for(partition), backend.client.pipeline(transaction=False)
        for minute in minutes:
            for series in ("ingress", "egress", "failed", "latency"):
                if rng.random() < 0.5:
                    pipe.set(keys.throughput("default", series, minute), rng.randrange(1, 5000), ex=3600)
        pipe.execute()


def expected_day(backend, now: float) -> tuple[History, History]:
    """Return the hour and the day as the per-minute history sums them, the day in clock-aligned quarters."""
    current = int(now // 60)
    first = current - current % 15 - 95 * 15
    minutes = backend.history("default", minutes=current - first + 1, now=now)
    history = History(minutes["enqueued"], minutes["finished"], minutes["failed"], minutes["latency_s"])
    return history.last(60), history.rebucket(15)


def charted(backend, now: float) -> tuple[History, History]:
    found = backend.charted("default", now=now)
    return tuple(History(**found[window]) for window in ("hour", "day"))  # type: ignore[return-value]


def test_the_charts_read_through_summaries_equals_the_per_minute_sums(backend):
    now = time.time()
    current = int(now // 60)
    write_counters(backend, range(current - 24 * 60, current + 1))
    want = expected_day(backend, now)

    first, second = (
        charted(backend, now),
        charted(backend, now),
    )  # the first stores the summaries, the second reads them

    assert first == want and second == want
    assert len(want[0].enqueued) == 60 and len(want[1].enqueued) == 96
    assert sum(want[1].enqueued) > 0 and any(v is not None for v in want[1].latency_s)


@pytest.mark.single_partition
def test_a_quarter_whose_summary_is_missing_is_summed_from_its_minutes_and_summarised(backend, raw):
    now = time.time()
    current = int(now // 60)
    write_counters(backend, range(current - 24 * 60, current + 1))
    charted(backend, now)
    quarter = current - current % 15 - 20 * 15  # five hours back, long closed
    raw.delete(backend.keys.quarter("default", quarter))  # as after an old release's console, or a lost key
    raw.incrby(backend.keys.throughput("default", "ingress", quarter + 3), 1000)

    hour, day = charted(backend, now)

    assert (hour, day) == expected_day(backend, now)
    assert day.enqueued[95 - 20] >= 1000
    assert raw.get(backend.keys.quarter("default", quarter)).decode().split(",")[0] == str(day.enqueued[95 - 20])


@pytest.mark.single_partition
def test_an_unreadable_summary_is_summed_from_its_minutes_again(backend, raw):
    now = time.time()
    current = int(now // 60)
    write_counters(backend, range(current - 24 * 60, current + 1))
    charted(backend, now)
    quarter = current - current % 15 - 40 * 15
    raw.set(backend.keys.quarter("default", quarter), b"\xff,not a number")

    assert charted(backend, now) == expected_day(backend, now)
    assert raw.get(backend.keys.quarter("default", quarter)).count(b",") == 3


@pytest.mark.single_partition
def test_a_quarter_closed_less_than_the_grace_ago_is_summed_but_not_stored(backend, raw):
    current = int(time.time() // 60)
    recent, old = current - current % 15 - 15, current - current % 15 - 4 * 15 - SUMMARY_GRACE_MINUTES
    for minute, value in ((recent + 2, 4), (old, 3), (old + 14, 5)):
        raw.set(backend.keys.throughput("default", "ingress", minute), value)
    raw.set(backend.keys.throughput("default", "latency", old + 1), 1500)

    summaries = backend.scripts.summarise_quarters("default", [recent, old], SUMMARY_GRACE_MINUTES)

    assert summaries == [b"4,0,0,", b"8,0,0,1500"]
    assert raw.get(backend.keys.quarter("default", recent)) is None
    assert raw.get(backend.keys.quarter("default", old)) == b"8,0,0,1500"
    assert 0 < raw.ttl(backend.keys.quarter("default", old)) <= 25 * 3600


@pytest.mark.single_partition
def test_a_summarised_day_reads_a_small_fraction_of_its_per_minute_keys(backend, raw):
    now = time.time()
    current = int(now // 60)
    write_counters(backend, range(current - 24 * 60, current + 1))
    charted(backend, now)
    raw.config_resetstat()

    charted(backend, now)

    stats = raw.info("stats")
    looked_up = stats["keyspace_hits"] + stats["keyspace_misses"]
    assert 60 * 4 <= looked_up <= 60 * 4 + 96 + 10, looked_up
    assert looked_up < PER_MINUTE_KEYS / 15
