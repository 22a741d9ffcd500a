"""The sweeper's calls are bounded: a 10,000-task join is swept over several calls, each short, and released once.

The parents are made final as an older release's acknowledge leaves them (segment successful, no
release of children, no count), on the session's own server; the server time of each call is read
from its SLOWLOG with every command logged.
"""

from __future__ import annotations

import statistics

import pytest
from django.tasks import task_backends

from tests import tasks
from tests.backends.conftest import finish
from threadmill.backends.broker import sweeper
from threadmill.backends.broker.sweeper import SWEEP_BATCH_SIZE, SWEEP_START, SWEEP_STEPS, Sweeper
from threadmill.base import Segment
from threadmill.running_workflow import RunningWorkflow
from threadmill.workflows import MAX_TASKS, Workflow

PREFIX = "threadmill:{default}"
#: Longest server time one sweep call may take, microseconds: "a few ms" (at most 3.5 ms measured), with room
#: for a loaded 2-core VM and for the SLOWLOG's own cost of logging every command inside the call (one call
#: reading all 9,999 parents took 37-110 ms).
LONGEST_CALL_US = 50_000
#: Median server time of those calls, microseconds (0.8-1.7 ms measured).
MEDIAN_CALL_US = 10_000


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def slowlog(backend):
    """Log every command's server time in the SLOWLOG for the test, then restore the server's settings."""
    client = backend.client
    before = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100_000)
    client.slowlog_reset()
    yield client
    for name, value in before.items():
        client.config_set(name, value)
    client.slowlog_reset()


def _join_of(parents: int):
    wf = Workflow()
    tops = [wf.add(tasks.echo) for _ in range(parents)]
    join = wf.add(tasks.echo, after=tops)
    return wf.enqueue(), tops, join


def _finish_as_an_older_release(backend, ids) -> None:
    """Record `ids` successful as the previous release's acknowledge does: no release, no count."""
    with backend.client.pipeline(transaction=False) as pipe:
        for task_id in ids:
            pipe.hset(f"{PREFIX}:task:{task_id}", "segment", "successful")
            pipe.zrem(f"{PREFIX}:default:ready", task_id)
            pipe.zadd(f"{PREFIX}:default:successful", {task_id: 1})
        pipe.execute()


def _sweep_calls(client) -> list[int]:
    """The server time, microseconds, of each script call in the SLOWLOG."""
    entries = client.slowlog_get(100_000)
    return [e["duration"] for e in entries if e["command"].split(b" ")[0].upper() in (b"EVALSHA", b"EVAL", b"FCALL")]


def test_a_10000_task_joins_sweep_takes_several_short_calls_and_releases_it_once(backend, slowlog):
    run, tops, join = _join_of(MAX_TASKS - 1)
    _finish_as_an_older_release(backend, [t.id for t in tops])
    slowlog.slowlog_reset()

    assert Sweeper(backend).sweep("default", 0) == MAX_TASKS - 1

    calls = _sweep_calls(slowlog)
    assert len(calls) >= (MAX_TASKS - 1) // SWEEP_STEPS
    assert max(calls) < LONGEST_CALL_US, sorted(calls)[-5:]
    assert statistics.median(calls) < MEDIAN_CALL_US
    assert backend.get_result(join.id).segment is Segment.READY
    assert backend.client.zscore(f"{PREFIX}:default:ready", join.id) is not None
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == MAX_TASKS - 1
    assert Sweeper(backend).sweep("default", 0) == 0
    assert backend.client.llen(f"{PREFIX}:default:wake") == 1


def _sweep_in_calls(backend, cursor, steps: int) -> tuple[int, int, object]:
    """Call sweep_waiting from `cursor` until the segment's end; return (settled, calls, last cursor)."""
    settled, calls, at_end = 0, 0, False
    while not at_end:
        done, cursor, at_end = backend.scripts.sweep_waiting("default", cursor, SWEEP_BATCH_SIZE, steps, 3600)
        settled, calls = settled + done, calls + 1
        assert calls < 100
    return settled, calls, cursor


def test_a_sweep_resumed_after_the_graph_changed_releases_the_join_once_when_its_last_parent_is_final(backend):
    wf = Workflow()
    tops = [wf.add(tasks.echo) for _ in range(1200)]
    join = wf.add(tasks.echo, after=tops, name="join")
    run = wf.enqueue()
    [caller] = backend.acquire("default", worker="w")
    others = [t.id for t in tops if t.id != caller.id]
    _finish_as_an_older_release(backend, others[:600])

    done, cursor, at_end = backend.scripts.sweep_waiting("default", SWEEP_START, SWEEP_BATCH_SIZE, 200, 3600)
    assert 0 < done < 200 and not at_end and cursor[1] == join.id and cursor[2] != "0"
    # Between two calls: the rest of the parents finish, and the running one adds a parent to the join.
    _finish_as_an_older_release(backend, others[600:])
    added = RunningWorkflow(backend, caller, backend.running_workflow(caller.id)).add(tasks.echo, before=["join"])
    settled, calls, _ = _sweep_in_calls(backend, cursor, 200)
    # The parents the first call had read while they ran are passed over until the next sweep reads them.
    settled += _sweep_in_calls(backend, SWEEP_START, 200)[0]

    assert done + settled == len(others) and calls > 1
    assert backend.client.smembers(f"{PREFIX}:pending:{join.id}") == {caller.id.encode(), added.id.encode()}
    assert backend.get_result(join.id).segment is Segment.WAITING
    assert finish(backend, caller) is True
    _finish_as_an_older_release(backend, [added.id])
    assert _sweep_in_calls(backend, SWEEP_START, 200)[0] == 1
    assert backend.get_result(join.id).segment is Segment.READY
    assert backend.client.zcount(f"{PREFIX}:default:ready", "-inf", "+inf") == 1
    counts = backend.get_workflow(run.id).counts
    assert (counts["WAITING"], counts["READY"], counts["SUCCESSFUL"]) == (0, 1, len(tops) + 1)
    assert _sweep_in_calls(backend, SWEEP_START, 200)[0] == 0


def test_a_sweep_cut_short_at_its_calls_resumes_where_it_stopped(backend, monkeypatch):
    run, tops, join = _join_of(2000)
    _finish_as_an_older_release(backend, [t.id for t in tops])
    monkeypatch.setattr(sweeper, "MAX_SWEEP_CALLS", 2)
    sweep = Sweeper(backend)

    settled = [sweep.sweep("default", 0)]
    assert 0 < settled[0] < 2000 and sweep.cursors[("default", 0)][1] == join.id
    while settled[-1] and len(settled) < 20:
        settled.append(sweep.sweep("default", 0))

    assert sum(settled) == 2000 and sweep.cursors == {}
    assert backend.get_result(join.id).segment is Segment.READY
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 2000
