"""Schedules: parsing the setting, and each tick enqueued once however many brokers run."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from threadmill.backends.broker import RedisBroker
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
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


# -- daylight saving: every real instant that matches the cron is a tick, once -------------------

#: Fall-back nights as (zone, the UTC instant its repeated hour starts): 02:00 CEST then CET, 01:00 EDT then EST.
FALL_BACK = [
    ("Europe/Berlin", datetime(2026, 10, 25, 0, 0, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 5, 0, tzinfo=UTC)),
]
#: Cron expressions with ticks in a fall-back night's repeated hour (02:00 in Berlin, 01:00 in New York).
FALL_BACK_CRONS = [
    (zone, cron)
    for zone, hour in (("Europe/Berlin", 2), ("America/New_York", 1))
    for cron in ("*/15 * * * *", "0 * * * *", f"*/20 {hour} * * *", f"30 {hour} * * *")
]


def _schedule(cron: str, zone: str):
    [schedule] = parse_schedules("default", {"n": {"task": "tests.tasks.echo", "cron": cron}}, ZoneInfo(zone))
    return schedule


def _minutes(start: datetime, hours: int):
    return [start + timedelta(minutes=minute) for minute in range(-60, 60 * hours)]


def _latest_ticks(schedule, moments) -> list[datetime]:
    """Each distinct latest tick over `moments`, in UTC (ticks of a repeated hour are equal as local times)."""
    ticks: list[datetime] = []
    for now in moments:
        tick = schedule.latest_tick(now).astimezone(UTC)
        if not ticks or ticks[-1] != tick:
            ticks.append(tick)
    return ticks


@pytest.mark.parametrize(("zone", "repeated"), FALL_BACK)
def test_a_fall_back_night_has_the_ticks_of_both_passes_of_the_repeated_hour(zone, repeated):
    schedule = _schedule("*/15 * * * *", zone)
    ticks = _latest_ticks(schedule, _minutes(repeated, 3))
    assert ticks == [repeated + timedelta(minutes=15 * n) for n in range(-4, 12)]
    # The first tick of the second pass, 02:00 CET (01:00 EST), is what comes after 02:45 CEST (01:45 EDT).
    second_pass = repeated + timedelta(hours=1)
    assert schedule.next_tick(second_pass - timedelta(minutes=1)).astimezone(UTC) == second_pass
    assert schedule.latest_tick(second_pass + timedelta(minutes=5)).astimezone(UTC) == second_pass


@pytest.mark.parametrize(("zone", "cron"), FALL_BACK_CRONS)
def test_latest_and_next_tick_agree_on_every_minute_of_a_fall_back_night(zone, cron):
    schedule = _schedule(cron, zone)
    for now in _minutes(dict(FALL_BACK)[zone], 3):
        latest, upcoming = schedule.latest_tick(now).astimezone(UTC), schedule.next_tick(now).astimezone(UTC)
        assert latest <= now < upcoming, now
        assert schedule.next_tick(latest).astimezone(UTC) == upcoming, now


def test_a_fixed_time_entry_runs_once_on_a_fall_back_night_and_after_the_gap_on_a_spring_forward_one():
    # cronsim reads an entry with a fixed hour and minute as Debian cron does: once a day.
    schedule = _schedule("30 2 * * *", "Europe/Berlin")
    fall_back = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST, the first pass
    assert _latest_ticks(schedule, _minutes(fall_back, 24)) == [fall_back - timedelta(days=1), fall_back]
    spring_forward = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 02:30 CET does not exist: 03:00 CEST
    assert schedule.next_tick(spring_forward - timedelta(hours=1)).astimezone(UTC) == spring_forward


def test_the_broker_enqueues_every_quarter_hour_of_a_fall_back_night_once(redis_url, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    backend = _backend(redis_url, {"quarterly": {"task": "tests.tasks.echo", "cron": "*/15 * * * *"}})
    broker = RedisBroker(backend, ["default"])
    repeated = datetime(2026, 10, 25, 0, 0, tzinfo=UTC)  # 02:00 CEST; 01:00 UTC is 02:00 CET
    enqueued = [broker.run_schedules(now) for now in _minutes(repeated, 3)]
    # First sight at 01:00 CEST only records that tick; then 4 runs an hour to 03:45 CET, 8 in the repeated hour.
    assert sum(enqueued) == 15
    assert backend.queue_stats()["default"][Segment.READY] == 15
    assert backend.schedule_states()["quarterly"]["last_tick"] == datetime(2026, 10, 25, 2, 45, tzinfo=UTC)


# -- an edited cron is a new schedule ---------------------------------------------------------------


def _nightly(redis_url, cron: str, zone: str = "UTC") -> RedisBroker:
    with override_settings(TIME_ZONE=zone):
        backend = _backend(redis_url, {"nightly": {"task": "tests.tasks.echo", "cron": cron}})
    return RedisBroker(backend, ["default"])


def _ready(broker: RedisBroker) -> int:
    return broker.backend.queue_stats()["default"][Segment.READY]


def test_an_edited_cron_starts_at_its_next_tick_not_at_one_that_passed_before_the_edit(redis_url):
    day = datetime(2026, 11, 30, tzinfo=UTC)
    before = _nightly(redis_url, "0 3 * * *")
    before.run_schedules(day - timedelta(hours=20))  # first sight
    assert before.run_schedules(day + timedelta(hours=3, seconds=10)) == 1
    # A deploy at 12:00:30 edits it to 09:00; an old release's broker, restarted, still runs beside the new one.
    after = _nightly(redis_url, "0 9 * * *")
    assert after.run_schedules(day + timedelta(hours=12, seconds=30)) == 0
    assert after.backend.client.hget(after.backend.keys.schedules(), "nightly:cron") == b"0 9 * * * UTC"
    assert _nightly(redis_url, "0 3 * * *").run_schedules(day + timedelta(hours=12, seconds=40)) == 0
    assert after.run_schedules(day + timedelta(days=1, hours=9, seconds=10)) == 1
    assert _ready(after) == 2


def test_a_new_zone_is_an_edit_but_a_respelt_cron_is_not(redis_url):
    day = datetime(2026, 11, 30, tzinfo=UTC)
    _nightly(redis_url, "0  3 * * *").run_schedules(day - timedelta(hours=20))
    # Every broker down over 03:00; one started at 05:00, its cron spelt differently, catches up once.
    restarted = _nightly(redis_url, "0 3 * * *")
    assert restarted.run_schedules(day + timedelta(hours=5)) == 1
    # 03:00 in Tokyo is 18:00 UTC: at 20:00 its latest tick, 18:00, is newer than the recorded one, 03:00.
    tokyo = _nightly(redis_url, "0 3 * * *", "Asia/Tokyo")
    assert tokyo.run_schedules(day + timedelta(hours=20)) == 0
    assert tokyo.run_schedules(day + timedelta(days=1, hours=18, seconds=10)) == 1
    assert _ready(tokyo) == 2


def test_a_rolling_deploy_that_edits_a_cron_runs_each_new_tick_once_and_none_that_passed_before(redis_url):
    start = datetime(2026, 11, 30, 12, 12, tzinfo=UTC)
    old = _nightly(redis_url, "*/15 * * * *")
    old.run_schedules(start - timedelta(hours=1))
    assert old.run_schedules(start) == 1  # 12:00
    new = _nightly(redis_url, "*/5 * * * *")  # its latest tick, 12:10, passed before the deploy
    runs = 0
    for minute in range(1, 39):  # both side by side to 12:50, the old one first, then the new one first
        now = start + timedelta(minutes=minute)
        pair = (old, new) if minute % 2 else (new, old)
        runs += sum(broker.run_schedules(now) for broker in pair)
    assert runs == 8  # 12:15 to 12:50: each tick of the new cron once, the old one's among them
    assert _ready(new) == 9
