"""Leases under stress: a task that outlives its lease, brokers racing, a worker whose clock is wrong."""

from __future__ import annotations

import glob
import json
import os
import time
from datetime import datetime

import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.faults.conftest import KINDS, SLACK_S, Tally, fault_backend, wait_for

pytestmark = pytest.mark.slow

#: libfaketime, from Debian's `faketime` package (.ci/bootstrap installs it).
LIBFAKETIME = next(
    iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), "/usr/lib/faketime/libfaketime.so.1"
)
#: Error classes a recovered lease may record: an expired lease, or a worker found dead.
RECOVERY_ERRORS = {"threadmill.exceptions.AcknowledgementTimeout", "threadmill.exceptions.WorkerLost"}


def _error_classes(result) -> list[str]:
    return [error.exception_class_path for error in result.errors]


@pytest.mark.parametrize("fault_server", KINDS, indirect=True)
def test_a_task_that_outlives_its_lease_is_retried_or_failed_and_its_late_acknowledgement_is_refused(
    tally: Tally, fault_server, start_pool
):
    quick = tally.enqueue(40, sleep_ms=20)
    # The first run of each sleeps 4.5 s, past the 3 s lease; the reaper retries or fails it.
    # The retry of `retried` is quick and ends before the first run; the retry of
    # `overlapping` is still running when the first run ends, in the same process.
    retried = tally.enqueue(1, first_attempt_sleep_ms=4500)[0]
    overlapping = tally.enqueue(1, sleep_ms=2000, first_attempt_sleep_ms=4500)[0]
    failed = tally.enqueue(1, task=tasks.count_run_without_retry, first_attempt_sleep_ms=4500)[0]
    pool = start_pool(fault_server, "-w", "1", "-t", "4", THREADMILL_TEST_LEASE_TTL="3")
    runs = {retried: 2, overlapping: 2, failed: 1}

    wait_for(
        lambda: (
            pool.alive() and tally.all_settled() and all(tally.finished()[task_id] >= n for task_id, n in runs.items())
        ),
        lambda: f"every run ended and every task settled ({tally.summary()})",
        30,
    )
    assert tally.never_ran() == [], tally.summary()
    assert tally.ran_twice() == {retried: 2, overlapping: 2}, tally.summary()
    for task_id in (retried, overlapping):
        again = tally.backend.get_result(task_id)
        assert again.status == TaskResultStatus.SUCCESSFUL
        assert _error_classes(again) == ["threadmill.exceptions.AcknowledgementTimeout"]
        assert again.attempts == 2
    lost = tally.backend.get_result(failed)
    assert lost.status == TaskResultStatus.FAILED  # The late acknowledgement did not overwrite the reaper's verdict.
    assert _error_classes(lost) == ["threadmill.exceptions.AcknowledgementTimeout"]
    assert tally.statuses()[TaskResultStatus.FAILED] == 1
    assert all(tally.backend.get_result(task_id).errors == [] for task_id in quick)
    wait_for(
        lambda: all(f"Acknowledgement of task {task_id} refused" in pool.output for task_id in runs),
        lambda: (
            "the late acknowledgement of each first run was sent and refused; refused: "
            + str([task_id for task_id in runs if f"Acknowledgement of task {task_id} refused" in pool.output])
            + f" of retried {retried}, overlapping {overlapping}, failed {failed}"
        ),
        2,
    )


def test_three_brokers_at_once_handle_every_expired_lease_exactly_once(tally: Tally, fault_server, start_pool):
    ghost = "ghost-host:1"
    orphans = tally.enqueue(100)
    # Leased by a worker that never runs them nor heartbeats: their leases expire after 1 s.
    leased = fault_backend(fault_server, lease_ttl=1).acquire("default", count=100, worker=ghost)
    assert sorted(r.id for r in leased) == sorted(orphans)
    others = tally.enqueue(200, sleep_ms=5)
    # Brokers that turn every 50 ms race for the same expired leases while their pools drain.
    pools = [
        start_pool(
            fault_server, "-w", "1", "-t", "2", THREADMILL_TEST_BROKER_INTERVAL="0.05", THREADMILL_TEST_LEASE_TTL="5"
        )
        for _ in range(3)
    ]

    wait_for(
        lambda: all(p.alive() for p in pools) and tally.all_settled(),
        lambda: f"every task ran ({tally.summary()})",
        60,
    )

    tally.assert_each_ran_once()
    for task_id in orphans:
        result = tally.backend.get_result(task_id)
        # Taken back once: one recorded attempt of the ghost and one error for it, or, for a
        # lease given back as never started, neither.
        assert len(result.errors) == result.worker_ids.count(ghost) <= 1, (result.worker_ids, _error_classes(result))
        assert set(_error_classes(result)) <= RECOVERY_ERRORS, _error_classes(result)
    assert all(tally.backend.get_result(task_id).errors == [] for task_id in others)


def test_a_worker_whose_clock_is_five_minutes_ahead_has_no_task_reaped_or_run_twice(
    tally: Tally, fault_server, start_pool
):
    assert os.path.exists(LIBFAKETIME), "libfaketime is missing: run `apt-get install faketime` (see .ci/bootstrap)."
    tally.enqueue(300, sleep_ms=20)
    # Short leases and liveness timeouts, so a decision taken on the wrong clock shows at once.
    short = {"THREADMILL_TEST_LEASE_TTL": "3", "THREADMILL_TEST_WORKER_TIMEOUT": "2"}
    on_time = start_pool(fault_server, "-w", "1", "-t", "2", **short)
    ahead = start_pool(
        fault_server,
        "-w",
        "1",
        "-t",
        "2",
        LD_PRELOAD=LIBFAKETIME,
        FAKETIME="+5m",
        # Only the wall clock is wrong, as on a machine whose clock drifted.
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        **short,
    )
    wait_for(lambda: ahead.records(), lambda: f"the skewed pool logs ({ahead.output[-2000:]})", 30)
    logged_at = datetime.fromisoformat(ahead.records()[0]["time"]).timestamp()
    assert logged_at - time.time() > 290, "the skewed pool's clock is not ahead"

    wait_for(
        lambda: on_time.alive() and ahead.alive() and tally.all_settled(),
        lambda: f"every task ran ({tally.summary()})",
        60,
    )
    # Keep both pools running a few lease lengths after the drain: a reaper or a liveness
    # check misled by the skew would now take back tasks it should not.
    deadline = time.monotonic() + 3 + 2 + SLACK_S
    while time.monotonic() < deadline:
        assert on_time.alive() and ahead.alive()
        time.sleep(0.2)

    tally.assert_each_ran_once()
    ahead_names = set(ahead.worker_names())
    ran_ahead = sum(bool(ahead_names & set(tally.backend.get_result(i).worker_ids)) for i in tally.ids)
    assert ran_ahead > 0, "the skewed pool ran no task"
    assert all(tally.backend.get_result(i).errors == [] for i in tally.ids)
    assert not [r for r in on_time.records() + ahead.records() if r["level"] in ("WARNING", "ERROR")], json.dumps(
        [r["message"] for r in on_time.records() + ahead.records() if r["level"] in ("WARNING", "ERROR")][:5]
    )
