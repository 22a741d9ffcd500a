"""Retry policies are pure: delays depend only on the attempt, the error and the randomness given."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.tasks import TaskContext

from tests.tasks import flaky
from threadmill.outcome import error_of, retry_delay
from threadmill.retry import ExponentialBackoff, backoff_delay, policy_from_spec, retry_spec


def _context(errors, attempts):
    from threadmill.base import ThreadmillTaskResult

    result = ThreadmillTaskResult(
        task=flaky, id="t", status="FAILED", enqueued_at=None, started_at=None, finished_at=None,
        last_attempted_at=None, args=[], kwargs={}, backend="default", errors=errors,
        worker_ids=["w"] * attempts,
    )  # fmt: skip
    return TaskContext(task_result=result)


def test_backoff_grows_by_the_factor_and_stops_at_the_cap():
    delays = [backoff_delay(n, base_s=1, factor=2, max_s=5, jitter=0, rand=0.5) for n in (1, 2, 3, 4)]
    assert delays == [1, 2, 4, 5]


def test_jitter_spreads_the_delay_both_ways():
    low = backoff_delay(1, base_s=10, factor=2, max_s=60, jitter=0.1, rand=0.0)
    high = backoff_delay(1, base_s=10, factor=2, max_s=60, jitter=0.1, rand=0.999999)
    assert low == pytest.approx(9.0)
    assert high == pytest.approx(11.0, abs=1e-4)


def test_the_policy_retries_expected_exceptions_until_max_retries():
    policy = ExponentialBackoff(base_delay=1, max_retries=2, expected_exceptions=(ValueError,), jitter=0)
    value_error = [error_of(ValueError("x"))]
    assert policy(_context(value_error, 1), rand=0.5) == timedelta(seconds=1)
    assert policy(_context(value_error, 2), rand=0.5) == timedelta(seconds=2)
    assert policy(_context(value_error, 3), rand=0.5) is None


def test_the_policy_does_not_retry_an_unexpected_exception():
    policy = ExponentialBackoff(expected_exceptions=(ValueError,))
    assert policy(_context([error_of(KeyError("x"))], 1)) is None


def test_a_policy_round_trips_through_its_spec():
    policy = ExponentialBackoff(base_delay=timedelta(seconds=3), max_retries=5, expected_exceptions=(OSError,))
    rebuilt = policy_from_spec(retry_spec(policy))
    assert rebuilt == policy_from_spec(retry_spec(rebuilt))
    assert rebuilt.max_retries == 5
    assert rebuilt.base_delay == 3.0


def test_a_policy_that_raises_means_no_retry(caplog):
    def broken(context):
        raise RuntimeError("policy bug")

    from threadmill.retry import next_retry_delay

    assert next_retry_delay(broken, _context([error_of(ValueError())], 1)) is None
    assert "policy" in caplog.text


def test_retry_delay_uses_the_tasks_policy():
    assert retry_delay(_context([error_of(ValueError("x"))], 1).task_result) == timedelta(seconds=0.05)


def test_a_bad_retry_value_is_rejected_at_definition():
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match="retry must be"):
        flaky.__class__(func=flaky.func, retry=5)
