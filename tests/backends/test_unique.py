"""Unique tasks: a duplicate enqueue returns the task holding its key, released when that task stops counting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from redis.crc import key_slot

from tests.backends.conftest import finish
from tests.tasks import echo, unique_bad_key, unique_briefly, unique_by_user, unique_echo
from threadmill.backends.script_source import LuaScript
from threadmill.base import Segment, ThreadmillTask


def _ready(backend) -> int:
    return backend.queue_stats()["default"][Segment.READY]


def test_a_duplicate_returns_the_waiting_task_and_stores_nothing(backend):
    first = backend.enqueue(unique_echo, ["a"], {})
    again = backend.enqueue(unique_echo, ["a"], {})
    other = backend.enqueue(unique_echo, ["b"], {})

    assert (first.duplicate, again.duplicate, other.duplicate) == (False, True, False)
    assert again.id == first.id and again.args == ["a"]
    assert other.id != first.id
    assert _ready(backend) == 2


def test_a_task_without_unique_enqueues_every_call(backend):
    results = [backend.enqueue(echo, ["a"], {}) for _ in range(3)]
    assert len({r.id for r in results}) == 3 and not any(r.duplicate for r in results)


def test_unique_key_names_the_work_whatever_the_other_arguments(backend):
    first = backend.enqueue(unique_by_user, [], {"user": 5, "note": "one"})
    again = backend.enqueue(unique_by_user, [], {"user": 5, "note": "two"})
    assert again.duplicate and again.id == first.id and again.kwargs == {"user": 5, "note": "one"}
    assert backend.get_result(first.id).unique_key.endswith(first.unique_key.rsplit(":", 1)[1])


def test_a_duplicate_does_not_send_task_enqueued(backend):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = backend.enqueue(unique_echo, ["a"], {})
        backend.enqueue(unique_echo, ["a"], {})
        backend.enqueue_many(unique_echo, [(["a"], {}), (["b"], {})])
    finally:
        task_enqueued.disconnect(receiver)
    assert len(seen) == 2 and seen[0] == first.id


def test_enqueue_many_stores_one_task_per_key_within_a_batch_and_against_stored_ones(backend):
    held = backend.enqueue(unique_echo, [0], {})

    results = backend.enqueue_many(unique_echo, [([i % 3], {}) for i in range(9)])

    assert [r.duplicate for r in results] == [True, False, False] + [True] * 6
    assert [r.args for r in results] == [[i % 3] for i in range(9)]
    assert {r.id for r in results[0::3]} == {held.id}
    assert {r.id for r in results[1::3]} == {results[1].id}
    assert _ready(backend) == 3


def test_finishing_releases_the_key(backend):
    first = backend.enqueue(unique_echo, ["a"], {})
    [leased] = backend.acquire("default", worker="w")
    assert backend.enqueue(unique_echo, ["a"], {}).duplicate  # running counts
    assert finish(backend, leased)

    again = backend.enqueue(unique_echo, ["a"], {})

    assert not again.duplicate and again.id != first.id


def test_cancelling_releases_the_key(backend):
    first = backend.enqueue(unique_echo, ["a"], {})
    assert backend.cancel(first.id)

    assert not backend.enqueue(unique_echo, ["a"], {}).duplicate


def test_purging_and_deleting_release_the_key(backend):
    backend.enqueue(unique_echo, ["a"], {})
    second = backend.enqueue(unique_echo, ["b"], {})
    backend.purge("default", segment="ready")
    assert not backend.enqueue(unique_echo, ["a"], {}).duplicate
    assert not backend.enqueue(unique_echo, ["b"], {}).duplicate
    third = backend.enqueue(unique_echo, ["c"], {})
    assert backend.delete([third.id, second.id]) == 1

    assert not backend.enqueue(unique_echo, ["c"], {}).duplicate


def _requeue(backend, how: str, task_id: str) -> bool:
    """Requeue a finished task as the console does: one by id (requeue.lua), or a selection (requeue_many.lua)."""
    if how == "by id":
        return backend.requeue(task_id)
    return backend.requeue_many("default", segment="successful", task_ids=[task_id]) == [task_id]


@pytest.mark.parametrize("how", ["by id", "selected"])
def test_requeueing_a_finished_unique_task_takes_its_key_back(backend, how):
    first = backend.enqueue(unique_echo, ["a"], {})
    [leased] = backend.acquire("default", worker="w")
    assert finish(backend, leased)

    assert _requeue(backend, how, first.id)

    again = backend.enqueue(unique_echo, ["a"], {})
    assert again.duplicate and again.id == first.id
    assert _ready(backend) == 1


@pytest.mark.parametrize("how", ["by id", "selected"])
def test_a_requeued_task_leaves_the_key_with_the_task_that_took_it_since(backend, how):
    first = backend.enqueue(unique_echo, ["a"], {})
    [leased] = backend.acquire("default", worker="w")
    assert finish(backend, leased)
    second = backend.enqueue(unique_echo, ["a"], {})
    assert not second.duplicate

    assert _requeue(backend, how, first.id)  # an operator's explicit requeue: it runs again all the same

    assert backend.get_result(first.id).status == "READY"
    again = backend.enqueue(unique_echo, ["a"], {})
    assert again.duplicate and again.id == second.id
    assert _ready(backend) == 2


def test_unique_for_admits_a_duplicate_once_it_passed_while_the_first_still_waits(backend):
    first = backend.enqueue(unique_briefly, ["a"], {})
    assert backend.enqueue(unique_briefly, ["a"], {}).duplicate
    deadline = time.monotonic() + 5
    while (again := backend.enqueue(unique_briefly, ["a"], {})).duplicate:
        assert time.monotonic() < deadline, "unique_for never let a duplicate in"
        time.sleep(0.05)

    assert again.id != first.id
    assert backend.get_result(first.id).status == "READY"


def test_a_key_whose_holder_is_gone_admits_the_next_enqueue(backend):
    """A key left behind (an older release's acknowledge does not release it) never blocks: its holder is checked."""
    first = backend.enqueue(unique_echo, ["a"], {})
    client = backend.client
    client.delete(backend.task_keys(first.id).task(first.id))

    assert not backend.enqueue(unique_echo, ["a"], {}).duplicate


def test_segments_decide_what_counts(backend):
    kept = ThreadmillTask(
        func=unique_echo.func, backend="default", unique=True, unique_segments=("ready", "running", "successful")
    )
    backend.enqueue(kept, ["a"], {})
    [leased] = backend.acquire("default", worker="w")
    finish(backend, leased)
    assert backend.enqueue(kept, ["a"], {}).duplicate  # its successful result still counts

    deferred = kept.using(run_after=datetime.now(UTC) + timedelta(hours=1))
    assert not backend.enqueue(deferred, ["b"], {}).duplicate
    assert not backend.enqueue(deferred, ["b"], {}).duplicate  # deferred does not count


def test_using_keeps_the_unique_settings():
    moved = unique_by_user.using(queue_name="emails", priority=5)
    assert moved.unique and moved.unique_key is unique_by_user.unique_key


def test_a_unique_key_that_is_not_a_string_is_refused_and_nothing_is_stored(backend):
    message = r"unique_key of task tests\.tasks\.unique_bad_key must return a non-empty str, not 42\."
    with pytest.raises(TypeError, match=message):
        backend.enqueue(unique_bad_key, [], {})
    with pytest.raises(TypeError, match="must return a non-empty str"):
        backend.enqueue_many(unique_bad_key, [([], {})])
    assert _ready(backend) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_key": "user"}, "unique_key must be a callable"),
        ({"unique_for": -1}, "unique_for must be a positive number of seconds or a timedelta, not -1."),
        ({"unique": "yes"}, "unique must be True or False, not 'yes'."),
        ({"unique": True, "unique_segments": ("ready", "unreadable")}, "unique_segments must name one or more of"),
        ({"unique": True, "unique_segments": ("nope",)}, "Unknown segment 'nope'"),
    ],
)
def test_bad_unique_settings_are_refused_when_the_task_is_defined(options, message):
    with pytest.raises(InvalidTask, match=message):
        ThreadmillTask(func=unique_echo.func, backend="default", **options)


_RACER = """
import json, sys
import django
django.setup()
import redis
from threadmill.backends.redis import RedisTaskBackend
from tests.tasks import unique_echo
backend = RedisTaskBackend("default", json.loads(sys.argv[1]))
gate = redis.Redis.from_url(sys.argv[2])
keys, me = int(sys.argv[3]), int(sys.argv[4])
results = []
for n in range(keys):
    # A barrier per key: each racer says it reached key n and waits until the other has too.
    gate.rpush(f"race:at:{1 - me}", n)
    assert gate.blpop(f"race:at:{me}", timeout=30), "the other racer never reached key %d" % n
    results.append(backend.enqueue(unique_echo, [f"key-{n}"], {}))
print(json.dumps({"ids": [r.id for r in results], "stored": sum(not r.duplicate for r in results)}))
"""
#: Unique keys the two racers enqueue, each raced afresh. Without the per-key barrier, one key
#: enqueued 1000 times was raced once: the racer that started first stored it, the other's
#: enqueues came after and were duplicates (and so were the next keys': 200 of 200 stored by one).
RACED_KEYS = 100


def test_two_processes_racing_the_same_enqueues_store_one_task_per_unique_key(backend, redis_url):
    params = json.dumps({"REDIS_URL": backend.redis_url, "CLUSTER": backend.cluster, "OPTIONS": backend.options})
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, params, redis_url, str(RACED_KEYS), str(me)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        )
        for me in range(2)
    ]
    reports = [json.loads(racer.communicate(timeout=60)[0]) for racer in racers]

    first, second = (report["ids"] for report in reports)
    assert [n for n in range(RACED_KEYS) if first[n] != second[n]] == []
    assert len(set(first)) == RACED_KEYS
    assert sum(report["stored"] for report in reports) == RACED_KEYS
    assert _ready(backend) == RACED_KEYS


async def test_aenqueue_returns_the_holder_of_a_duplicate(backend):
    first = await backend.aenqueue(unique_echo, ["a"], {})
    again = await backend.aenqueue(unique_echo, ["a"], {})
    assert (first.duplicate, again.duplicate, again.id) == (False, True, first.id)
    assert again.unique_key == first.unique_key != ""


def test_the_enqueue_script_stores_the_key_and_acknowledge_deletes_it(backend, raw):
    result = backend.enqueue(unique_echo, ["a"], {})
    digest = result.unique_key.rsplit(":", 1)[1]
    assert result.unique_key == f"threadmill:{{default}}:unique:{digest}"
    assert raw.get(result.unique_key) == result.id.encode() and raw.ttl(result.unique_key) == -1
    assert raw.hmget(f"threadmill:{{default}}:task:{result.id}", "unique", "unique_segments") == [
        digest.encode(),
        b"ready,deferred,running",
    ]
    [leased] = backend.acquire("default", worker="w")
    finish(backend, leased)
    assert raw.exists(result.unique_key) == 0


def test_unique_for_sets_the_keys_expiry(backend, raw):
    result = backend.enqueue(unique_briefly, ["a"], {})
    assert 0 < raw.pttl(result.unique_key) <= 300


#: The release before unique tasks, whose acknowledge knows nothing of the key.
PREVIOUS_RELEASE = "5835d2b"


def _previous_release_source(name: str) -> str:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        ["git", "-C", str(root), "show", f"{PREVIOUS_RELEASE}:threadmill/backends/lua/{name}.lua"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"This test reads the previous release's {name}.lua from git: fetch {PREVIOUS_RELEASE}.")
    return done.stdout


def test_a_key_an_older_release_acknowledged_past_does_not_block_the_next_enqueue(backend, raw):
    first = backend.enqueue(unique_echo, ["a"], {})
    [leased] = backend.acquire("default", worker="w")
    backend.scripts._acknowledge = LuaScript(_previous_release_source("acknowledge"))
    assert finish(backend, leased)
    assert raw.get(first.unique_key) == first.id.encode()  # the older script left the key

    again = backend.enqueue(unique_echo, ["a"], {})

    assert not again.duplicate
    assert raw.get(first.unique_key) == again.id.encode()


def test_the_key_shares_the_slot_of_its_tasks_other_keys(backend):
    for value in range(6):
        result = backend.enqueue(unique_echo, [value], {})
        assert key_slot(result.unique_key.encode()) == key_slot(backend.task_keys(result.id).task(result.id).encode())
