"""Time limits as configured and stored: `@task(timeout=...)`, the options, the task spec, the lease extension."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import task
from django.tasks.exceptions import InvalidTask

from tests.tasks import echo, sleep_past_limit
from threadmill.backends import codec
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment

URL = "redis://127.0.0.1:1/0"


def test_a_task_takes_its_time_limit_as_seconds_or_a_timedelta_and_using_keeps_it():
    assert task(timeout=2)(_noop).timeout == timedelta(seconds=2)
    bounded = task(timeout=timedelta(milliseconds=1500))(_noop)
    assert bounded.timeout == timedelta(seconds=1.5)
    assert bounded.using(priority=5, queue_name="emails").timeout == timedelta(seconds=1.5)
    assert task(_noop).timeout is None


@pytest.mark.parametrize("bad", [0, -1, "10", True, timedelta(0), float("inf"), float("nan")])
def test_a_bad_time_limit_is_a_clear_invalid_task(bad):
    with pytest.raises(InvalidTask, match=r"timeout must be a positive number of seconds or a timedelta, not "):
        task(timeout=bad)(_noop)


def test_the_time_limit_options_default_to_no_limit_and_ten_seconds_of_grace():
    config = RedisTaskBackend("x", {"REDIS_URL": URL}).config
    assert (config.task_timeout, config.timeout_grace) == (None, 10.0)
    config = RedisTaskBackend(
        "x", {"REDIS_URL": URL, "OPTIONS": {"task_timeout": timedelta(minutes=1), "timeout_grace": 2}}
    ).config
    assert (config.task_timeout, config.timeout_grace) == (60.0, 2.0)
    assert RedisTaskBackend("x", {"REDIS_URL": URL, "OPTIONS": {"task_timeout": None}}).config.task_timeout is None


@pytest.mark.parametrize("name, bad", [("task_timeout", 0), ("task_timeout", "1m"), ("timeout_grace", None),
                                       ("timeout_grace", -2)])  # fmt: skip
def test_a_bad_time_limit_option_is_named(name, bad):
    with pytest.raises(ImproperlyConfigured, match=rf"\['{name}'\] must be a positive number of seconds"):
        RedisTaskBackend("x", {"REDIS_URL": URL, "OPTIONS": {name: bad}})


def test_the_time_limit_travels_with_the_stored_task_and_only_when_there_is_one():
    bounded = replace(echo, timeout=timedelta(seconds=7))
    document = codec.encode_new(bounded, codec.new_task_id(), [], {}, time.time())
    assert json.loads(document)["task"]["timeout"] == 7.0
    decoded = codec.decode(document.encode(), Segment.READY)
    assert decoded.task.timeout == timedelta(seconds=7)
    assert '"timeout":7.0' in codec.encode_result(decoded)
    # A task without a limit is stored as the previous release stored it.
    assert "timeout" not in json.loads(codec.encode_new(echo, codec.new_task_id(), [], {}, time.time()))["task"]


def test_a_stored_task_without_a_limit_runs_without_one_whatever_the_code_says_now():
    # Enqueued before the task got its limit (or by the previous release): the stored spec wins.
    document = json.loads(codec.encode_new(sleep_past_limit, codec.new_task_id(), [], {}, time.time()))
    del document["task"]["timeout"]
    assert codec.decode(json.dumps(document).encode(), Segment.READY).task.timeout is None


def test_extend_lease_pushes_the_deadline_out_fenced_by_the_token_and_never_pulls_it_in(backend):
    backend.enqueue(replace(echo, timeout=timedelta(seconds=30)), [], {})
    (result,) = backend.acquire("default", worker="h:1:a")
    running = backend.task_keys(result.id).segment("default", Segment.RUNNING)
    leased_until = backend.client.zscore(running, result.id)

    assert backend.extend_lease(result, 4000.0)
    now = backend.client.time()
    extended = backend.client.zscore(running, result.id)
    assert extended >= now[0] + 3999 and extended > leased_until
    assert result.lease_deadline.timestamp() == pytest.approx(extended, abs=1e-3)
    assert backend.extend_lease(result, 1.0)
    assert backend.client.zscore(running, result.id) == extended
    stale = replace(result, lease_token="someone-else:1")
    assert not backend.extend_lease(stale, 9000.0)
    assert backend.client.zscore(running, result.id) == extended


def _noop():
    pass
