"""Unreadable payloads of every kind injected while a pool drains: quarantined, never lost, never in the way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import redis

from tests import tasks
from tests.backends.test_unreadable import POISONS, _apply_poison
from tests.faults.conftest import Tally, wait_for
from threadmill.base import Segment

pytestmark = pytest.mark.slow


def test_the_poison_matrix_injected_under_load_is_quarantined_and_every_good_task_runs_once(
    tally: Tally, fault_server, start_pool
):
    tally.enqueue(800, sleep_ms=5)
    pool = start_pool(fault_server, "-w", "2", "-t", "2")
    wait_for(lambda: pool.alive() and tally.successful() >= 20, lambda: "a drain is under way", 30)

    raw = redis.Redis.from_url(fault_server.url)
    poisoned = []
    for poison in POISONS.values():
        # Behind every good task (lowest priority) so no worker leases it before it is poisoned;
        # and once more deferred, so it reaches the workers through the mover.
        for task in (
            tasks.echo.using(priority=-100),
            tasks.echo.using(run_after=datetime.now(UTC) + timedelta(seconds=1)),
        ):
            result = tally.backend.enqueue(task, [], {})
            _apply_poison(raw, result.id, poison)
            poisoned.append(result.id)

    unreadable = tally.backend.keys.segment("default", Segment.UNREADABLE)
    wait_for(
        lambda: pool.alive() and tally.all_settled() and raw.zcard(unreadable) == len(poisoned),
        lambda: (
            f"the drain ends and every poison is quarantined ({tally.summary()}, {raw.zcard(unreadable)} unreadable)"
        ),
        60,
    )

    tally.assert_each_ran_once()
    assert sorted(m.decode() for m in raw.zrange(unreadable, 0, -1)) == sorted(poisoned)
    assert all(raw.hget(f"threadmill:{{default}}:task:{i}", "segment") == b"unreadable" for i in poisoned)
    segments = tally.segments()
    assert segments[Segment.SUCCESSFUL] + segments[Segment.UNREADABLE] == len(tally.ids) + len(poisoned)
    assert (segments[Segment.READY], segments[Segment.DEFERRED], segments[Segment.RUNNING]) == (0, 0, 0)
    assert pool.respawns() == [], pool.respawns()
