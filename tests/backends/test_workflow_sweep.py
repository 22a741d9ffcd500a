"""The sweeper's and the recounter's calls are bounded: a 10,000-task workflow is swept or recounted over several
short calls, the join released once, each outcome counted once, and the graph's text not read by every call.

The parents are made final as an older release's acknowledge leaves them (segment successful, no
release of children, no count), on the session's own server; the server time of each call is read
from its SLOWLOG with every command logged.
"""

from __future__ import annotations

import pytest
from django.tasks import task_backends

from tests import tasks
from tests.backends.conftest import finish
from threadmill.backends.broker import recounter, sweeper
from threadmill.backends.broker.recounter import RECOUNT_TASKS, Recounter
from threadmill.backends.broker.sweeper import SWEEP_BATCH_SIZE, SWEEP_START, SWEEP_STEPS, Sweeper
from threadmill.base import Segment
from threadmill.running_workflow import RunningWorkflow
from threadmill.workflows import MAX_TASKS, Workflow

PREFIX = "threadmill:{default}"
#: Longest server time one call may take, microseconds: "a few ms" (at most 3.9 ms measured), with room for a
#: loaded 2-core VM (one sweep call reading all 9,999 parents of a join took 37-110 ms).
LONGEST_CALL_US = 50_000
#: Mean server time of those calls, microseconds (1-2 ms measured).
MEAN_CALL_US = 10_000


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def slowlog(backend):
    """Log each command slower than 1 ms in the SLOWLOG for the test (not all: logging a script's every command
    would be the most of its time), then restore the server's settings."""
    client = backend.client
    before = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 1000)
    client.config_set("slowlog-max-len", 10_000)
    client.slowlog_reset()
    yield client
    for name, value in before.items():
        client.config_set(name, value)
    client.slowlog_reset()


def _stats(client) -> dict[str, tuple[int, int]]:
    """Each command's (calls, server microseconds) so far, a script's own commands counted too."""
    return {name: (s["calls"], s["usec"]) for name, s in client.info("commandstats").items()}


def _calls(client, since: dict, command: str) -> tuple[int, int]:
    """(calls, server microseconds) of `command` (as commandstats names it) since `since`."""
    calls, usec = _stats(client).get(f"cmdstat_{command}", (0, 0))
    before = since.get(f"cmdstat_{command}", (0, 0))
    return calls - before[0], usec - before[1]


def _longest_script_call(client) -> int:
    """The longest server time, microseconds, of a script call in the SLOWLOG (0 when none took 1 ms)."""
    entries = client.slowlog_get(10_000)
    return max((e["duration"] for e in entries if e["command"].split(b" ")[0].upper() == b"EVALSHA"), default=0)


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


def test_a_10000_task_joins_sweep_takes_several_short_calls_and_releases_it_once(backend, slowlog):
    run, tops, join = _join_of(MAX_TASKS - 1)
    _finish_as_an_older_release(backend, [t.id for t in tops])
    Sweeper(backend).sweep("emails", 0)  # the script loaded: its first call is not a NOSCRIPT reply
    slowlog.slowlog_reset()
    since = _stats(slowlog)

    assert Sweeper(backend).sweep("default", 0) == MAX_TASKS - 1

    calls, usec = _calls(slowlog, since, "evalsha")
    assert calls >= (MAX_TASKS - 1) // SWEEP_STEPS
    assert _longest_script_call(slowlog) < LONGEST_CALL_US and usec / calls < MEAN_CALL_US
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


def test_a_recount_of_a_10000_task_workflow_reads_its_graph_twice_a_pass_in_short_calls(backend, slowlog):
    assert Recounter(backend).recount(0) == 0  # the script loaded: no call below is a NOSCRIPT reply
    wf = Workflow()
    root = wf.add(tasks.echo)
    children = [wf.add(tasks.echo, after=[root]) for _ in range(MAX_TASKS - 1)]
    run = wf.enqueue()
    _finish_as_an_older_release(backend, [c.id for c in children[::33]])
    slowlog.slowlog_reset()
    since = _stats(slowlog)

    assert Recounter(backend).recount(0) == len(children[::33])

    calls, usec = _calls(slowlog, since, "evalsha")
    assert calls == MAX_TASKS // RECOUNT_TASKS
    assert _longest_script_call(slowlog) < LONGEST_CALL_US and usec / calls < MEAN_CALL_US
    # The only HGETs are the graph's: the first call's, the duty's own, and the last call's for what follows.
    assert _calls(slowlog, since, "hget")[0] <= 3
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == len(children[::33])


def test_a_recount_resumed_after_a_task_was_added_at_run_time_counts_it_once(backend, monkeypatch):
    wf = Workflow()
    root = wf.add(tasks.echo)
    children = [wf.add(tasks.echo, after=[root]) for _ in range(2000)]
    run = wf.enqueue()
    [caller] = backend.acquire("default", worker="w")
    _finish_as_an_older_release(backend, [c.id for c in children])
    monkeypatch.setattr(recounter, "MAX_RECOUNT_CALLS", 2)
    duty = Recounter(backend)

    assert duty.recount(0) == 2 * RECOUNT_TASKS - 1  # the root, read first, runs
    added = RunningWorkflow(backend, caller, backend.running_workflow(caller.id)).add(tasks.echo)
    _finish_as_an_older_release(backend, [added.id])
    counted = [duty.recount(0) for _ in range(3)]

    assert sum(counted) == 2000 + 1 - (2 * RECOUNT_TASKS - 1) and counted[-1] == 0
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 2001
    assert duty.recount(0) == 0
