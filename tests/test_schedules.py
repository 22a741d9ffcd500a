"""Schedules: parsing the setting, and each tick enqueued once however many brokers run."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured

from threadmill.backends.base import Segment
from threadmill.backends.redis import RedisBroker, RedisTaskBackend
from threadmill.schedules import parse_schedules

EVERY_MINUTE = {"task": "tests.tasks.echo", "cron": "* * * * *", "args": ["tick"]}


def _backend(redis_url, schedule=None) -> RedisTaskBackend:
    return RedisTaskBackend("default", {"REDIS_URL": redis_url, "SCHEDULE": schedule or {"minutely": EVERY_MINUTE}})


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"bad name!": EVERY_MINUTE}, "entry name 'bad name!'"),
        ({"n": {"task": "tests.tasks.echo", "cron": "61 * * * *"}}, "['n']['cron'] '61 * * * *' is not a valid cron"),
        ({"n": {"task": "tests.tasks.echo", "cron": "* * * * *", "when": 1}}, "['n'] has unknown key(s) when"),
        ({"n": {"cron": "* * * * *"}}, "['n']['task'] must be the dotted path of a task"),
        ({"n": {"task": "tests.tasks.echo", "cron": "* * * * *", "args": "x"}}, "'args' must be a list"),
        (["not", "a", "dict"], "must be a dict of name -> entry"),
    ],
)
def test_a_bad_schedule_is_improperly_configured_naming_the_entry(schedule, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_schedules("default", schedule, ZoneInfo("UTC"))
    assert message in str(raised.value)


def test_a_missing_task_names_its_entry(redis_url):
    backend = _backend(redis_url, {"gone": {"task": "tests.tasks.no_such_task", "cron": "* * * * *"}})
    with pytest.raises(ImproperlyConfigured, match="SCHEDULE entry 'gone': cannot import task"):
        backend.schedules[0].task()


def test_ticks_are_read_in_the_configured_timezone():
    [schedule] = parse_schedules("a", {"n": {"task": "t.t", "cron": "0 3 * * *"}}, ZoneInfo("Europe/Paris"))
    now = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
    assert schedule.latest_tick(now) == datetime(2026, 7, 1, 1, 0, tzinfo=UTC)
    assert schedule.next_tick(now) == datetime(2026, 7, 2, 1, 0, tzinfo=UTC)


def test_a_new_schedule_records_its_tick_and_runs_from_the_next_one(redis_url):
    backend = _backend(redis_url)
    [schedule] = backend.schedules
    tick = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    assert backend.enqueue_scheduled(schedule, tick) is None
    assert backend.enqueue_scheduled(schedule, tick) is None
    result = backend.enqueue_scheduled(schedule, tick + timedelta(minutes=1))

    assert result is not None and result.args == ["tick"]
    state = backend.schedule_states()["minutely"]
    assert state["last_task"] == result.id
    assert state["last_tick"] == tick + timedelta(minutes=1)


def test_a_run_missed_while_everything_was_down_is_enqueued_once(redis_url):
    backend = _backend(redis_url)
    [schedule] = backend.schedules
    tick = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    backend.enqueue_scheduled(schedule, tick)
    # An hour down: sixty ticks missed; the broker offers only the latest.
    assert backend.enqueue_scheduled(schedule, tick + timedelta(hours=1)) is not None
    assert backend.enqueue_scheduled(schedule, tick + timedelta(minutes=30)) is None
    assert backend.queue_stats()["default"][Segment.READY] == 1


def test_three_brokers_at_once_enqueue_each_tick_exactly_once(redis_url):
    backend = _backend(redis_url)
    [schedule] = backend.schedules
    base = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    backend.enqueue_scheduled(schedule, base)
    barrier = threading.Barrier(3)
    won = []

    def broker() -> None:
        own = _backend(redis_url)  # a supervisor of its own, with its own connections
        for minute in range(1, 21):
            barrier.wait()
            if own.enqueue_scheduled(own.schedules[0], base + timedelta(minutes=minute)) is not None:
                won.append(minute)

    threads = [threading.Thread(target=broker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(won) == list(range(1, 21))
    assert backend.queue_stats()["default"][Segment.READY] == 20


def test_a_paused_schedule_skips_its_ticks_and_resumes_at_the_next(redis_url):
    backend = _backend(redis_url)
    [schedule] = backend.schedules
    tick = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    backend.enqueue_scheduled(schedule, tick)
    assert backend.pause_schedule("minutely", by="alice") is True

    assert backend.enqueue_scheduled(schedule, tick + timedelta(minutes=1)) is None
    assert backend.schedule_states()["minutely"]["paused"]["by"] == "alice"
    assert backend.resume_schedule("minutely") is True
    assert backend.enqueue_scheduled(schedule, tick + timedelta(minutes=1)) is None
    assert backend.enqueue_scheduled(schedule, tick + timedelta(minutes=2)) is not None


def test_run_now_enqueues_whatever_the_state_and_is_recorded_as_the_last_run(redis_url):
    backend = _backend(redis_url)
    backend.pause_schedule("minutely")
    result = backend.enqueue_scheduled(backend.schedules[0], None)
    assert result is not None
    assert backend.schedule_states()["minutely"]["last_task"] == result.id


def test_the_broker_offers_the_latest_tick_once_per_tick(redis_url):
    backend = _backend(redis_url)
    broker = RedisBroker(backend, ["default"])
    assert broker.run_schedules() == 0  # first sight: the tick is recorded
    assert broker.run_schedules() == 0
    backend.client.hset(backend.keys.schedules(), "minutely:tick", "0")  # as if the last run were long ago
    broker._ticks_seen.clear()
    assert broker.run_schedules() == 1
    assert backend.queue_stats()["default"][Segment.READY] == 1
