"""`enqueue_retry`: the option and the pause between attempts (the faults themselves: tests/faults/test_enqueue_retry.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from threadmill.backends.enqueue_retry import MAX_PAUSE_S, is_transient, pause_before, retrying
from threadmill.backends.errors import out_of_memory
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import ServerOutOfMemory, ServerUnreachable

URL = "redis://127.0.0.1:1/0"


def test_enqueue_retry_defaults_to_five_seconds_and_takes_zero_or_a_timedelta():
    assert RedisTaskBackend("x", {"REDIS_URL": URL}).config.enqueue_retry == 5.0
    assert RedisTaskBackend("x", {"REDIS_URL": URL, "OPTIONS": {"enqueue_retry": 0}}).config.enqueue_retry == 0.0
    options = {"enqueue_retry": timedelta(milliseconds=1500)}
    assert RedisTaskBackend("x", {"REDIS_URL": URL, "OPTIONS": options}).config.enqueue_retry == 1.5


@pytest.mark.parametrize("value", [-1, "5", True, float("inf"), None])
def test_a_bad_enqueue_retry_is_refused_naming_it(value):
    with pytest.raises(ImproperlyConfigured) as caught:
        RedisTaskBackend("x", {"REDIS_URL": URL, "OPTIONS": {"enqueue_retry": value}})
    assert str(caught.value) == (
        f"TASKS['x']['OPTIONS']['enqueue_retry'] must be 0 or a positive number of seconds or a timedelta, "
        f"not {value!r}."
    )


def test_the_pause_doubles_up_to_its_longest_and_never_outlasts_the_budget():
    pauses = [pause_before(retry, 10.0, 0.999999) for retry in range(1, 8)]
    assert pauses[0] == pytest.approx(0.02)
    assert pauses[1] == pytest.approx(0.04)
    assert max(pauses) == pytest.approx(MAX_PAUSE_S)
    assert pause_before(1, 10.0, 0.0) == pytest.approx(0.01)
    assert pause_before(7, 0.05, 0.5) == 0.05
    assert pause_before(3, -0.1, 0.5) == 0.0


def test_a_full_server_refusal_is_not_transient_and_is_raised_at_the_first_attempt():
    refusal = out_of_memory(redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."))
    assert not is_transient(refusal)
    assert is_transient(ServerUnreachable("Cannot reach the Redis server: down"))
    attempts = []

    def send():
        attempts.append(1)
        raise refusal

    with pytest.raises(ServerOutOfMemory):
        retrying(10.0, [("task-1",)], send)
    assert len(attempts) == 1
