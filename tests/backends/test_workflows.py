"""The workflow scripts through their wrappers: the enqueue's retry and the release's fence, key by key."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.tasks import TaskResultStatus, task_backends

from tests import tasks
from tests.backends.conftest import same_server
from tests.worker.conftest import start_worker, wait_until  # noqa: F401 - start_worker is a fixture
from threadmill.backends import codec
from threadmill.backends.broker import RedisBroker
from threadmill.backends.broker.passes import BrokerPass, PassFailures
from threadmill.backends.broker.recounter import Recounter
from threadmill.backends.broker.sweeper import Sweeper
from threadmill.backends.options import DEFAULT_SWEEP_INTERVAL_S
from threadmill.backends.redis import RedisTaskBackend
from threadmill.backends.script_source import LuaScript, expand_includes
from threadmill.base import Segment
from threadmill.workflows import Workflow

PREFIX = "threadmill:{default}"


@pytest.fixture
def backend():
    return task_backends["default"]


def _chain(backend):
    wf = Workflow()
    parent = wf.add(tasks.echo, ("parent",))
    child = wf.add(tasks.echo, ("child",), after=[parent])
    return wf.enqueue(), parent, child


def _succeeded(result):
    return dataclasses.replace(result, status=TaskResultStatus.SUCCESSFUL)


def _contents(client) -> dict[bytes, object]:
    """Every key's value; a hash's as a dict (a DUMP of one being rehashed lists its fields in another order)."""
    keys = client.keys(f"{PREFIX}*")
    return {key: client.hgetall(key) if client.type(key) == b"hash" else client.dump(key) for key in keys}


def test_an_enqueue_retried_after_a_lost_reply_writes_nothing_more(backend):
    run, _parent, _child = _chain(backend)
    before = _contents(backend.client)
    graph = backend.client.hget(f"{PREFIX}:workflow:{run.id}", "graph").decode()
    assert backend.scripts.enqueue_workflow(run.id, "", graph, []) == 0
    assert _contents(backend.client) == before


def test_a_child_waits_with_its_parent_pending_and_the_parent_knows_it(backend):
    _run, parent, child = _chain(backend)
    client = backend.client
    assert client.zrange(f"{PREFIX}:default:waiting", 0, -1) == [child.id.encode()]
    assert client.smembers(f"{PREFIX}:pending:{child.id}") == {parent.id.encode()}
    assert client.smembers(f"{PREFIX}:children:{parent.id}") == {child.id.encode()}
    assert backend.get_result(child.id).status == TaskResultStatus.READY
    assert backend.queue_stats()["default"][Segment.WAITING] == 1


def test_a_refused_acknowledgement_leaves_the_child_waiting(backend):
    run, parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    stale = dataclasses.replace(_succeeded(leased), lease_token="not-the-lease")
    assert backend.acknowledge(stale) is False
    assert backend.get_result(child.id).segment is Segment.WAITING
    assert backend.client.smembers(f"{PREFIX}:pending:{child.id}") == {parent.id.encode()}
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 0


def test_the_accepted_acknowledgement_releases_the_child_once_and_wakes_its_queue(backend):
    run, parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    backend.client.delete(f"{PREFIX}:default:wake")
    assert backend.acknowledge(_succeeded(leased)) is True
    assert backend.get_result(child.id).segment is Segment.READY
    assert backend.client.lrange(f"{PREFIX}:default:wake", 0, -1) == [b"1"]
    assert not backend.client.exists(f"{PREFIX}:pending:{child.id}", f"{PREFIX}:children:{parent.id}")
    # The same acknowledgement again (a reply lost, sent twice): the fence refuses it, nothing counts twice.
    assert backend.acknowledge(_succeeded(leased)) is False
    assert backend.get_workflow(run.id).counts == {
        "WAITING": 0, "READY": 1, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": 0,
    }  # fmt: skip


def test_a_requeued_parent_does_not_release_its_child(backend):
    _run, parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    assert backend.requeue(leased) is True
    assert backend.get_result(child.id).segment is Segment.WAITING
    assert backend.client.smembers(f"{PREFIX}:pending:{child.id}") == {parent.id.encode()}


#: The commit this branch started from: its acknowledge.lua is the previous release's, which never settles.
PREVIOUS_ACKNOWLEDGE = "6657d0f"


@pytest.fixture
def previous_acknowledge(backend, monkeypatch):
    """Make this process acknowledge with the previous release's acknowledge.lua (no release of children)."""
    source = subprocess.run(
        ["git", "show", f"{PREVIOUS_ACKNOWLEDGE}:threadmill/backends/lua/acknowledge.lua"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    monkeypatch.setattr(backend.scripts, "_acknowledge", LuaScript(expand_includes(source)))


def test_the_sweep_releases_a_child_whose_parent_an_older_release_acknowledged(backend, previous_acknowledge):
    run, _parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(_succeeded(leased)) is True
    assert backend.get_result(child.id).segment is Segment.WAITING
    assert Sweeper(backend).sweep("default", 0) == 1
    assert backend.get_result(child.id).segment is Segment.READY
    assert Sweeper(backend).sweep("default", 0) == 0
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 1


def test_the_sweep_fails_the_children_of_a_parent_an_older_release_failed(backend, previous_acknowledge):
    run, _parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(dataclasses.replace(leased, status=TaskResultStatus.FAILED)) is True
    assert Sweeper(backend).sweep("default", 0) == 1
    result = backend.get_result(child.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "threadmill.exceptions.UpstreamFailed"
    assert backend.get_workflow(run.id).counts == {
        "WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 2,
    }  # fmt: skip


def test_a_pool_starts_a_child_within_seconds_of_its_parent_acknowledged_by_an_older_release(
    backend, previous_acknowledge, start_worker
):
    _run, _parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(_succeeded(leased)) is True
    started = time.monotonic()
    start_worker("-w", "1", "-t", "1", "-q", "default")
    wait_until(lambda: backend.get_result(child.id).status == TaskResultStatus.SUCCESSFUL, "the child ran")
    assert time.monotonic() - started < 3 * DEFAULT_SWEEP_INTERVAL_S


def test_the_sweeper_waits_its_sweep_interval_or_the_broker_interval_when_that_is_longer():
    def interval(**options) -> float:
        return Sweeper(RedisTaskBackend("x", {"REDIS_URL": "redis://127.0.0.1:1/0", "OPTIONS": options})).interval()

    assert interval() == DEFAULT_SWEEP_INTERVAL_S == 5.0
    assert interval(sweep_interval=timedelta(milliseconds=500), broker_interval=0.2) == 0.5
    assert interval(sweep_interval=0.5, broker_interval=2) == 2.0
    with pytest.raises(ImproperlyConfigured, match="'sweep_interval'. must be a positive number"):
        interval(sweep_interval=0)


def _wide_cascade():
    """A root with 1,200 children, 600 of which share one grandchild: more than one call's budget."""
    wf = Workflow()
    root = wf.add(tasks.echo)
    middle = [wf.add(tasks.echo, after=[root]) for _ in range(1200)]
    wf.add(tasks.echo, after=middle[:600])
    return wf.enqueue()


def test_a_cascade_past_one_calls_budget_is_finished_by_the_acknowledgement_and_counted_once(backend):
    run = _wide_cascade()
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(dataclasses.replace(leased, status=TaskResultStatus.FAILED)) is True
    assert backend.get_workflow(run.id).counts == {
        "WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1202,
    }  # fmt: skip
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert not backend.client.exists(f"{PREFIX}:settling")


def test_a_release_cut_short_waits_on_the_settling_list_and_the_sweep_finishes_it(backend):
    run = _wide_cascade()
    leased = backend.acquire("default", worker="w")[0]
    # The script alone, as a worker that stopped before it could continue the release.
    failed = dataclasses.replace(leased, status=TaskResultStatus.FAILED)
    entry = (leased.id, "default", leased.lease_token, codec.encode_result(failed, None), Segment.FAILED)
    assert backend.scripts.acknowledge([entry], backend.config.result_ttl, 0) == [2]
    cut_short = backend.get_workflow(run.id).counts
    assert cut_short["WAITING"] > 0 and cut_short["FAILED"] < 1202
    assert backend.client.llen(f"{PREFIX}:settling") > 0
    assert Sweeper(backend).run_once(BrokerPass(["default"], range(1), PassFailures(backend))) > 0
    assert backend.get_workflow(run.id).counts == {
        "WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1202,
    }  # fmt: skip
    assert not backend.client.exists(f"{PREFIX}:settling")


def test_a_fan_out_of_three_thousand_is_released_by_its_acknowledgement_each_child_once(backend):
    wf = Workflow()
    root = wf.add(tasks.echo)
    children = [wf.add(tasks.echo, (i,), after=[root]) for i in range(3000)]
    run = wf.enqueue()
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(_succeeded(leased)) is True
    ready = backend.client.zrange(f"{PREFIX}:default:ready", 0, -1)
    assert sorted(ready) == sorted(child.id.encode() for child in children)
    assert backend.client.zcard(f"{PREFIX}:default:waiting") == 0
    assert backend.get_workflow(run.id).counts["READY"] == 3000
    assert not backend.client.exists(f"{PREFIX}:settling", f"{PREFIX}:children:{root.id}")


def test_continue_settling_with_nothing_cut_short_runs_one_command(backend):
    backend.client.config_resetstat()
    assert backend.scripts.continue_settling(backend.config.result_ttl) == (0, 0)
    calls = {k: v["calls"] for k, v in backend.client.info("commandstats").items() if "resetstat" not in k}
    assert calls == {"cmdstat_evalsha": 1, "cmdstat_llen": 1}


def test_awaits_release_while_a_parent_is_ready_or_running_and_not_after(backend):
    assert backend.scripts.awaits_release(["default"]) is False
    _run, _parent, child = _chain(backend)
    assert backend.scripts.awaits_release(["default"]) is True  # the parent is ready
    assert backend.scripts.awaits_release(["emails"]) is False  # nothing of that queue waits
    leased = backend.acquire("default", worker="w")[0]
    assert backend.scripts.awaits_release(["emails", "default"]) is True  # the parent runs
    assert backend.acknowledge(_succeeded(leased)) is True
    assert backend.get_result(child.id).segment is Segment.READY
    assert backend.scripts.awaits_release(["default"]) is False  # released: nothing waits


def test_an_older_brokers_sweep_alone_finishes_a_release_cut_short_and_the_list_left_is_harmless(backend):
    run = _wide_cascade()
    leased = backend.acquire("default", worker="w")[0]
    failed = dataclasses.replace(leased, status=TaskResultStatus.FAILED)
    entry = (leased.id, "default", leased.lease_token, codec.encode_result(failed, None), Segment.FAILED)
    assert backend.scripts.acknowledge([entry], backend.config.result_ttl, 0) == [2]
    # The previous release's sweeper walks the waiting segment and never reads the settling list.
    assert Sweeper(backend).sweep("default", 0) > 0
    done = {"WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 0, "FAILED": 1202}
    assert backend.get_workflow(run.id).counts == done
    # What it left on the list settles nothing twice when this release's sweeper continues it.
    assert backend.client.llen(f"{PREFIX}:settling") > 0
    backend.finish_settling()
    assert backend.get_workflow(run.id).counts == done
    assert not backend.client.exists(f"{PREFIX}:settling")


def test_the_recounter_counts_a_leaf_an_older_release_acknowledged_and_the_record_expires(
    backend, previous_acknowledge
):
    run, _parent, child = _chain(backend)
    record = f"{PREFIX}:workflow:{run.id}"
    backend.acknowledge(_succeeded(backend.acquire("default", worker="w")[0]))
    Sweeper(backend).sweep("default", 0)  # the parent has a child: the sweep counts it and releases the child
    [leaf] = backend.acquire("default", worker="w")
    assert leaf.id == child.id and backend.acknowledge(dataclasses.replace(leaf, status=TaskResultStatus.FAILED))
    assert backend.get_workflow(run.id).counts["FAILED"] == 0 and backend.client.ttl(record) == -1
    assert Sweeper(backend).sweep("default", 0) == 0  # nothing waits on the leaf

    assert Recounter(backend).recount() == 1

    assert backend.get_workflow(run.id).counts == {
        "WAITING": 0, "READY": 0, "RUNNING": 0, "SUCCESSFUL": 1, "FAILED": 1,
    }  # fmt: skip
    assert backend.client.hexists(record, "finished_at") and 0 < backend.client.ttl(record)
    assert Recounter(backend).recount() == 0  # counted once


def test_the_recounter_resumes_inside_a_graph_its_budget_cut_and_leaves_counted_tasks_alone(backend, monkeypatch):
    from threadmill.backends.broker import recounter

    wf = Workflow()
    for i in range(5):
        wf.add(tasks.echo, (i,))
    run = wf.enqueue()
    leased = backend.acquire("default", count=5, worker="w")
    assert backend.acknowledge(_succeeded(leased[0]))  # this release counts it
    for result in leased[1:]:  # an older release recorded these without counting them
        backend.client.hset(f"{PREFIX}:task:{result.id}", "segment", "successful")
    monkeypatch.setattr(recounter, "RECOUNT_TASKS", 2)
    monkeypatch.setattr(recounter, "MAX_RECOUNT_CALLS", 1)
    duty = Recounter(backend)

    assert [duty.recount() for _ in range(3)] == [1, 2, 1]

    assert duty.cursors[0] == (0, 0)
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 5
    assert backend.client.hexists(f"{PREFIX}:workflow:{run.id}", "finished_at")


def test_the_recounter_on_a_server_without_workflows_sends_one_script_running_one_command(backend):
    Recounter(backend).recount()  # loads the script
    backend.client.config_resetstat()
    assert Recounter(backend).recount() == 0
    calls = {name: row["calls"] for name, row in backend.client.info("commandstats").items()}
    assert calls == {"cmdstat_config|resetstat": 1, "cmdstat_evalsha": 1, "cmdstat_zrange": 1}


def _commands(backend) -> int:
    return sum(stat["calls"] for name, stat in backend.client.info("commandstats").items() if name != "cmdstat_info")


def test_a_fan_in_parent_whose_child_still_waits_adds_five_commands_to_its_acknowledgement(backend):
    # Its count, its children popped, the child's fields, its pending set and whether that emptied: its counted
    # mark goes in the HSET that stores its outcome, and the record's counts are not read while a child is left open.
    wf = Workflow()
    parents = [wf.add(tasks.echo, (i,)) for i in range(3)]
    wf.add(tasks.echo, after=parents, name="join")
    run = wf.enqueue()
    for i in range(2):
        tasks.echo.enqueue(f"plain {i}")
    leased = backend.acquire("default", count=5, worker="w")
    workflow_task, plain = leased[0], leased[3:]
    assert backend.acknowledge(_succeeded(plain[0])) is True  # this minute's counters made: the next pays no EXPIRE
    before = _commands(backend)
    assert backend.acknowledge(_succeeded(plain[1])) is True
    plain_cost = _commands(backend) - before
    before = _commands(backend)
    assert backend.acknowledge(_succeeded(workflow_task)) is True
    assert _commands(backend) - before == plain_cost + 5
    assert backend.client.hget(f"{PREFIX}:task:{workflow_task.id}", "counted") == b"1"
    for parent in leased[1:3]:
        assert backend.acknowledge(_succeeded(parent)) is True
    assert backend.get_result(run.tasks["join"].id).segment is Segment.READY
    assert backend.get_workflow(run.id).counts["SUCCESSFUL"] == 3


def test_fan_in_parents_acknowledged_in_one_call_read_their_join_once_and_leave_its_pending_set_in_one_srem(backend):
    wf = Workflow()
    parents = [wf.add(tasks.echo, (i,)) for i in range(4)]
    join = wf.add(tasks.echo, after=parents, name="join")
    run = wf.enqueue()
    leased = backend.acquire("default", count=4, worker="w")
    backend.client.config_resetstat()
    assert backend.acknowledge_many([(_succeeded(r), None) for r in leased[:3]]) == [True] * 3
    calls = {name.removeprefix("cmdstat_"): row["calls"] for name, row in backend.client.info("commandstats").items()}
    # Each parent pops its children; the join's fields, its pending set and the record's count, once for the three.
    assert (calls["spop"], calls["srem"], calls["exists"], calls.get("hsetnx", 0)) == (3, 1, 1, 0)
    # HMGET: the three fences and the join's fields; HINCRBY: the record's count and the queue's totals.
    assert (calls["hmget"], calls["hincrby"]) == (3 + 1, 1 + 1)
    record = backend.client.hgetall(f"{PREFIX}:workflow:{run.id}")
    assert (record[b"successful"], record[b"waiting"]) == (b"3", b"1")
    assert backend.client.smembers(f"{PREFIX}:pending:{join.id}") == {leased[3].id.encode()}
    assert backend.get_result(join.id).segment is Segment.WAITING
    assert backend.acknowledge(_succeeded(leased[3])) is True
    assert backend.get_result(join.id).segment is Segment.READY
    record = backend.client.hgetall(f"{PREFIX}:workflow:{run.id}")
    assert (record[b"successful"], record[b"waiting"]) == (b"4", b"0")


#: The commit before the acknowledgement settled its tasks together: its scripts release a parent at a time.
PER_PARENT_RELEASE = "1b3a732"


def _source_at(commit: str, name: str) -> str:
    """Return script `name` as it was at `commit`, its includes expanded from that commit's lib files."""

    def show(path: str) -> str:
        done = subprocess.run(["git", "show", f"{commit}:threadmill/backends/lua/{path}"], capture_output=True, text=True,
                              check=True)  # fmt: skip
        return done.stdout

    include = re.compile(r"^-- include: (\w+)$", re.MULTILINE)
    return include.sub(lambda m: show(f"lib/{m.group(1)}.lua"), show(f"{name}.lua"))


def test_a_join_whose_parents_the_release_before_and_this_one_acknowledge_runs_once_counted_once(backend, monkeypatch):
    # A rolling deploy: one parent acknowledged by a worker of the release before (a parent a call), the next two in
    # one call of this release's, the last by the release before again; the join is released by the last, once.
    wf = Workflow()
    parents = [wf.add(tasks.echo, (i,)) for i in range(4)]
    join = wf.add(tasks.echo, after=parents, name="join")
    run = wf.enqueue()
    leased = backend.acquire("default", count=4, worker="w")
    current = backend.scripts._acknowledge
    before = LuaScript(_source_at(PER_PARENT_RELEASE, "acknowledge"))
    monkeypatch.setattr(backend.scripts, "_acknowledge", before)
    assert backend.acknowledge(_succeeded(leased[0])) is True
    monkeypatch.setattr(backend.scripts, "_acknowledge", current)
    assert backend.acknowledge_many([(_succeeded(r), None) for r in leased[1:3]]) == [True, True]
    assert backend.get_result(join.id).segment is Segment.WAITING
    monkeypatch.setattr(backend.scripts, "_acknowledge", before)
    assert backend.acknowledge(_succeeded(leased[3])) is True
    assert backend.get_result(join.id).segment is Segment.READY
    assert backend.client.zrange(f"{PREFIX}:default:ready", 0, -1) == [join.id.encode()]
    assert Sweeper(backend).sweep("default", 0) == 0
    record = backend.client.hgetall(f"{PREFIX}:workflow:{run.id}")
    assert (record[b"successful"], record[b"waiting"]) == (b"4", b"0")


def test_a_parent_failing_in_the_call_that_counts_its_sibling_fails_the_join_once(backend):
    # The success's removal from the join's pending set waits for the call's end; the failure fails the join first.
    wf = Workflow()
    parents = [wf.add(tasks.echo, (i,)) for i in range(2)]
    join = wf.add(tasks.echo, after=parents, name="join")
    run = wf.enqueue()
    leased = backend.acquire("default", count=2, worker="w")
    failed = dataclasses.replace(leased[1], status=TaskResultStatus.FAILED)
    assert backend.acknowledge_many([(_succeeded(leased[0]), None), (failed, None)]) == [True, True]
    assert backend.get_result(join.id).segment is Segment.FAILED
    assert not backend.client.exists(f"{PREFIX}:pending:{join.id}")
    assert backend.client.zrange(f"{PREFIX}:default:waiting", 0, -1) == []
    record = backend.client.hgetall(f"{PREFIX}:workflow:{run.id}")
    assert (record[b"successful"], record[b"failed"], record[b"waiting"]) == (b"1", b"2", b"0")
    assert b"finished_at" in record


def test_the_brokers_first_pass_leaves_the_sweep_to_one_interval_later(backend, previous_acknowledge):
    # A pool's start drains what queued meanwhile; a sweep then would scan every waiting task beside it.
    _run, _parent, child = _chain(backend)
    leased = backend.acquire("default", worker="w")[0]
    assert backend.acknowledge(_succeeded(leased)) is True
    broker = RedisBroker(backend, ["default"])
    broker.run_once(due_only=True)
    assert backend.get_result(child.id).segment is Segment.WAITING
    assert {name for name, at in broker._due_at.items() if at > time.monotonic()} >= {"sweeper", "recounter"}
    broker._due_at["sweeper"] -= DEFAULT_SWEEP_INTERVAL_S  # one interval later
    broker.run_once(due_only=True)
    assert backend.get_result(child.id).segment is Segment.READY


def _calls(backend, *names: str) -> list[int]:
    stats = backend.client.info("commandstats")
    return [stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in names]


def test_a_release_moves_its_children_to_ready_in_one_zrem_and_one_zadd(backend):
    wf = Workflow()
    root = wf.add(tasks.echo, ("root",))
    children = [wf.add(tasks.echo, (i,), after=[root]) for i in range(3)]
    run = wf.enqueue()
    leased = backend.acquire("default", worker="w")[0]
    before = _calls(backend, "zadd", "zrem", "hincrby")
    assert backend.acknowledge(_succeeded(leased)) is True
    after = _calls(backend, "zadd", "zrem", "hincrby")
    # The root's own: ZADD to successful, ZREM from running, HINCRBY of its count and its queue's totals.
    assert [b - a for a, b in zip(before, after, strict=True)] == [1 + 1, 1 + 1, 2 + 1]
    assert {backend.get_result(child.id).segment for child in children} == {Segment.READY}
    assert backend.get_workflow(run.id).counts["WAITING"] == 0


def test_a_finished_workflow_leaves_the_index_once_its_record_expired_and_an_open_one_stays(backend):
    short = RedisTaskBackend("default", same_server(backend, QUEUES=["default"], OPTIONS={"result_ttl": 1}))
    finished, _parent, _child = _chain(backend)
    for _ in range(2):
        assert short.acknowledge(_succeeded(short.acquire("default", worker="w")[0]))
    still_open, _, _ = _chain(backend)
    index, record = f"{PREFIX}:workflows", f"{PREFIX}:workflow:{finished.id}"
    wait_until(lambda: not backend.client.exists(record), "the finished workflow's record expired", timeout=5)
    assert backend.client.zcard(index) == 2  # nothing but a pass takes it out

    Recounter(backend).run_once(BrokerPass(["default"], range(1), PassFailures(backend)))

    assert backend.client.zrange(index, 0, -1) == [still_open.id.encode()]
    assert Recounter(backend).recount() == 0 and backend.client.zcard(index) == 1


def test_a_workflow_task_with_a_per_task_limit_is_held_to_it_once_its_parent_releases_it(backend):
    wf = Workflow()
    root = wf.add(tasks.echo, ("root",))
    limited = [wf.add(tasks.three_at_a_time, (i,), after=[root]) for i in range(5)]
    plain = wf.add(tasks.echo, ("plain",), after=[root])
    wf.enqueue()
    client = backend.client
    assert client.hget(f"{PREFIX}:task:{limited[0].id}", "limit_path") == b"tests.tasks.three_at_a_time"
    assert client.hget(f"{PREFIX}:task:{plain.id}", "limit_path") is None
    assert client.hget(f"{PREFIX}:task-limits", "tests.tasks.three_at_a_time") == b"3||"
    assert client.hget(f"{PREFIX}:limited-queues", "default") == b"1"

    [leased_root] = backend.acquire("default", worker="w")
    assert backend.acknowledge(_succeeded(leased_root)) is True
    leased = backend.acquire("default", worker="w", count=10)

    assert sorted(r.id for r in leased) == sorted([plain.id] + [n.id for n in limited[:3]])
    assert backend.acquire("default", worker="w", count=10).held_back
    assert backend.acknowledge(_succeeded(next(r for r in leased if r.id == limited[0].id))) is True
    assert [r.id for r in backend.acquire("default", worker="w", count=10)] == [limited[3].id]


def test_a_plain_workflow_leaves_no_trace_of_per_task_limits(backend):
    _chain(backend)
    assert backend.client.exists(f"{PREFIX}:task-limits", f"{PREFIX}:limited-queues") == 0
