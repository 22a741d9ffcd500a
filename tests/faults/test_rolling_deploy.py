"""A rolling deploy: the previous release's worker pool and this one's on the same server, each killed once.

A workflow drained by both: every task once, each child started after its parents finished
(the landed main's acknowledge releases children; before workflows, this release's sweeper does).

The previous release runs from a `git worktree` of its commit, with its own scripts, worker
names (`host:pid`) and stored fields. Each broker must recover the other release's leases,
and every task runs once, but for the tasks a killed process had finished and not yet
acknowledged. Counted on the counter server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.tasks import TaskResultStatus, task_backends

from tests.faults.conftest import QUEUES, SLACK_S, Pool, Tally, fault_env, wait_for, wait_for_drain
from tests.faults.counter_log import Count, CounterLog
from tests.servers import start_full_server
from tests.tasks import echo
from tests.worker.conftest import ROOT, worker_env
from threadmill.backends.redis import RedisTaskBackend
from threadmill.exceptions import ServerOutOfMemory
from threadmill.workflows import Workflow

pytestmark = pytest.mark.slow

#: The previous release: the last commit landed before worker names, suspects and the cron field.
PREVIOUS_RELEASE = "a7f2b45"
#: The release landed before this one's new stored fields and script arguments (attempts, unique,
#: limits, per-task statistics, enqueue retries).
LAST_LANDED_RELEASE = "5835d2b"
#: The release landed before per-task limits (a task hash field, three keys, two enqueue arguments).
BEFORE_TASK_LIMITS = "f7b4fe4"
#: The release landed before operator commands were sent by a script a full server takes (#29).
BEFORE_SCRIPTED_COMMANDS = "1981cd9"
#: The landed main this release follows: its acknowledge releases a workflow's children too.
LANDED_MAIN = "80dbf88"
#: The release landed before workflows: its acknowledge stores a workflow task's outcome and releases nothing.
BEFORE_WORKFLOWS = "5412d60"
#: This release's sweeper interval beside the release before workflows, seconds: the default 5 s made each
#: child an old worker's parent released wait up to a sweep, about 10 s of the test's 15 on the loaded machine.
SWEEP_INTERVAL_S = 1.0


def _release_tree(commit: str) -> Iterator[Path]:
    """A worktree of `commit`, removed at the end."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("The rolling-deploy test runs the previous release from a git worktree: run it in a git checkout.")
    if not _has_commit(commit):
        # A shallow clone (a CI checkout) lacks it: fetch the history from where it was cloned.
        subprocess.run(["git", "-C", str(ROOT), "fetch", "--quiet", "--unshallow"], check=False, capture_output=True)
    if not _has_commit(commit):
        pytest.fail(f"The previous release {commit} is not in this checkout; fetch the history (git fetch).")
    where = Path(tempfile.mkdtemp(prefix="threadmill-previous-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
                   check=True, capture_output=True)  # fmt: skip
    yield where
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)
    shutil.rmtree(where.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """A worktree of the previous release (before worker names, suspects and the cron field)."""
    yield from _release_tree(PREVIOUS_RELEASE)


@pytest.fixture(scope="module")
def last_landed_release() -> Iterator[Path]:
    """A worktree of the release before attempt records, unique keys, limits and per-task statistics."""
    yield from _release_tree(LAST_LANDED_RELEASE)


@pytest.fixture(scope="module")
def release_before_task_limits() -> Iterator[Path]:
    """A worktree of the release before per-task limits."""
    yield from _release_tree(BEFORE_TASK_LIMITS)


@pytest.fixture(scope="module")
def release_before_scripted_commands() -> Iterator[Path]:
    """A worktree of the release whose `threadmill stop` was a plain HSET."""
    yield from _release_tree(BEFORE_SCRIPTED_COMMANDS)


@pytest.fixture(scope="module", params=[LANDED_MAIN, BEFORE_WORKFLOWS], ids=["landed-main", "before-workflows"])
def workflow_release(request) -> Iterator[tuple[str, Path]]:
    """A worktree of the landed main, then of the release before workflows: (commit, tree)."""
    for tree in _release_tree(request.param):
        yield request.param, tree


def _has_commit(commit: str) -> bool:
    probe = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return probe.returncode == 0


class PreviousReleasePool(Pool):
    """A pool of the previous release: its `manage.py` run in that release's tree, on the same server."""

    def __init__(self, tree: Path, *args: str, env: dict[str, str]) -> None:
        self.COMMAND_PREFIX = ("env", "-C", str(tree))
        super().__init__(*args, env=env)


def _kill_worker_process(pool: Pool) -> None:
    """kill -9 the pool's one worker process and wait until it is gone."""
    (victim,) = pool.children()
    # The handle is taken before the signal: the supervisor may reap the pid before a later lookup.
    handle = psutil.Process(victim)
    handle.send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs([handle], timeout=5)
    assert not alive, f"worker process {victim} outlived kill -9"


def _runs(pool: Pool) -> bool:
    """Whether the pool's one worker process is up and has said so."""
    return len(pool.children()) == 1 and re.search(r"Worker process \S+ started", pool.output) is not None


def _drain_killing_each_once(tally: Tally, old: Pool, new: Pool) -> tuple[set[str], str]:
    """Drain with both pools, kill -9 the old one's worker, then the new one's; return what may run twice and the old log.

    Only a task a killed process had finished, its acknowledgement not yet sent, may run again.
    """
    try:
        # Both pools' worker processes must run before the kill: the older release starts slower
        # (its settings load the console's stack), and this one alone drained the 60 before it forked.
        wait_for(lambda: old.alive() and new.alive() and _runs(old) and _runs(new) and tally.successful() >= 60,
                 lambda: f"both pools drain ({tally.summary()}): {old.output[-2000:]}", 30)  # fmt: skip
        # Each snapshot comes after its kill: a task the victim finished between a snapshot and
        # the signal, its acknowledgement unsent, may run again too.
        _kill_worker_process(old)
        may_run_twice = set(tally.finished())
        wait_for(lambda: old.alive() and tally.successful() >= 150,
                 lambda: f"the drain goes on after the old worker's kill ({tally.summary()})", 30)  # fmt: skip
        _kill_worker_process(new)
        may_run_twice |= set(tally.finished())
        wait_for_drain(new, tally, 60)
        old.alive()
        return may_run_twice, old.output
    finally:
        old.close()


def _assert_every_task_ran_once_but_at_the_kills(tally: Tally, may_run_twice: set[str]) -> None:
    twice = tally.ran_twice()
    assert set(twice) <= may_run_twice and len(twice) <= 8, f"ran twice: {twice}"
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()


def test_old_and_new_pools_recover_each_other_s_leases_and_every_task_runs_once(
    tally: Tally, fault_server, counter_server, start_pool, previous_release
):
    tally.enqueue(300, sleep_ms=30)
    old = PreviousReleasePool(previous_release, "-w", "1", "-t", "2", env=fault_env(fault_server, counter_server.url))
    new = start_pool(fault_server, "-w", "1", "-t", "2")
    may_run_twice, old_log = _drain_killing_each_once(tally, old, new)

    _assert_every_task_ran_once_but_at_the_kills(tally, may_run_twice)
    assert "respawning it" in old_log and "respawning it" in new.output
    # Really two releases: the old one names its processes host:pid, this one host:pid:incarnation.
    assert re.search(r"Worker process [^ :]+:\d+ started", old_log), old_log[-2000:]
    assert re.search(r"Worker process [^ :]+:\d+:[a-z]+ started", new.output), new.output[-2000:]


def test_the_last_release_beside_this_one_loses_nothing_and_its_runs_read_back(
    tally: Tally, fault_server, counter_server, start_pool, last_landed_release
):
    ids = tally.enqueue(300, sleep_ms=30)  # by this release's enqueue script
    env = fault_env(fault_server, counter_server.url)
    old = PreviousReleasePool(last_landed_release, "-w", "1", "-t", "2", env=env)
    new = start_pool(fault_server, "-w", "1", "-t", "2")
    may_run_twice, _ = _drain_killing_each_once(tally, old, new)

    _assert_every_task_ran_once_but_at_the_kills(tally, may_run_twice)
    # Both releases ran tasks; this one's runs carry attempt records, the older one's none, and
    # every task reads back either way.
    results = [tally.backend.get_result(task_id) for task_id in ids]
    recorded = [r for r in results if r.attempt_records]
    assert 0 < len(recorded) < len(results), (len(recorded), len(results))
    # Per-task statistics count this release's runs only (the older one sends none).
    counted = sum(s.runs for s in tally.backend.task_stats(minutes=60))
    assert 0 < counted < sum(tally.finished().values()), counted


def test_the_release_before_per_task_limits_runs_limited_tasks_beside_this_one_and_loses_none(
    tally: Tally, fault_server, counter_server, start_pool, release_before_task_limits
):
    # The same path in both trees: this release's enqueue marks it limited, the older worker ignores the mark.
    from tests.tasks import count_run

    limited = dataclasses.replace(count_run, concurrency=3)
    ids = tally.enqueue(150, task=limited, sleep_ms=30) + tally.enqueue(150, sleep_ms=30)
    env = fault_env(fault_server, counter_server.url)
    old = PreviousReleasePool(release_before_task_limits, "-w", "1", "-t", "2", env=env)
    new = start_pool(fault_server, "-w", "1", "-t", "2")
    may_run_twice, _ = _drain_killing_each_once(tally, old, new)

    _assert_every_task_ran_once_but_at_the_kills(tally, may_run_twice)
    # The path's running set holds no run that still counts once the drain is over.
    keys, client = tally.backend.keys_for(0), tally.backend.client
    running = keys.task_limit_prefix() + "tests.tasks.count_run:running"
    assert client.hget(keys.task(ids[0]), "limit_path") == b"tests.tasks.count_run"
    assert [m for m in client.smembers(running) if client.hget(keys.task(m.decode()), "segment") == b"running"] == []


def test_a_pool_of_the_release_before_scripted_commands_stops_on_this_release_s_stop_while_the_server_is_full(
    release_before_scripted_commands, counter_server
):
    # This release leaves a stop by script (a full server takes it) in the same hash and format:
    # the previous release's supervisors must still take it.
    server = start_full_server("valkey", "4mb")
    backend = RedisTaskBackend("default", {"REDIS_URL": server.url, "QUEUES": QUEUES})
    pool = PreviousReleasePool(
        release_before_scripted_commands, "-w", "2", "-t", "2", env=fault_env(server, counter_server.url)
    )
    try:
        wait_for(
            lambda: pool.alive() and len(backend.live_workers()) == 2, lambda: "the old pool's two processes beat", 30
        )
        for queue_name in QUEUES:
            backend.pause(queue_name, by="test")
        stored = 0
        with contextlib.suppress(ServerOutOfMemory):
            while stored < 100_000:
                backend.enqueue(echo, ["x" * 800], {})
                stored += 1
        assert stored > 100
        # Under half the memory it holds, the server stays full whatever expires meanwhile.
        backend.client.config_set("maxmemory", backend.client.info("memory")["used_memory"] // 2)
        with pytest.raises(ServerOutOfMemory):
            backend.enqueue(echo, [], {})
        stop = subprocess.run(
            [sys.executable, "manage.py", "threadmill", "stop", "--all"],
            cwd=ROOT, env=worker_env(THREADMILL_TEST_REDIS_URL=server.url), capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stderr
        assert pool.process.wait(30) == 0, pool.output[-4000:]
        assert pool.respawns() == [], pool.output[-4000:]
    finally:
        pool.close()
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


def _diamond_and_fan_in(parents: int) -> Workflow:
    """A diamond (its branches on two queues) and a fan-in of `parents` on both queues, joined by the diamond's foot."""
    from tests.tasks import count_run

    wf = Workflow(name="rolling")
    emails = count_run.using(queue_name="emails")
    top = wf.add(count_run, kwargs={"sleep_ms": 30}, name="top")
    left = wf.add(count_run, kwargs={"sleep_ms": 30}, after=[top], name="left")
    right = wf.add(emails, kwargs={"sleep_ms": 30}, after=[top], name="right")
    foot = wf.add(count_run, kwargs={"sleep_ms": 30}, after=[left, right], name="foot")
    fan = [wf.add((emails if i % 2 else count_run), kwargs={"sleep_ms": 30}, name=f"p{i}") for i in range(parents)]
    wf.add(count_run, after=[*fan, foot], name="join")
    return wf


def _assert_each_child_started_after_its_parents_finished(wf: Workflow, counts: list[Count]) -> float:
    """Assert it; return the longest wait of a child from its last parent's finish to its start, seconds."""
    starts = {c.task_id: c for c in counts if c.kind == "started"}
    finishes = {c.task_id: c for c in counts if c.kind == "finished"}
    longest = 0.0
    for node in (n for n in wf.nodes if n.parents):
        for parent in node.parents:
            assert starts[node.id].at > finishes[parent.id].at, (
                f"{node.name} started (count {starts[node.id].at}) before its parent {parent.name} finished "
                f"(count {finishes[parent.id].at})"
            )
        longest = max(longest, starts[node.id].time - max(finishes[p.id].time for p in node.parents))
    return longest


def test_a_previous_release_beside_this_one_drains_a_workflow_each_task_once_and_each_child_after_its_parents(
    workflow_release, fault_server, counter, counter_server, start_pool, settings
):
    commit, tree = workflow_release
    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": fault_server.url}}
    tally = Tally(task_backends["default"], counter)
    old = PreviousReleasePool(tree, "-w", "1", "-t", "2", env=fault_env(fault_server, counter_server.url))
    try:
        # Only this release's options shorten its sweeper: the old release's settings know no such option.
        new = start_pool(fault_server, "-w", "1", "-t", "2", THREADMILL_TEST_SWEEP_INTERVAL=str(SWEEP_INTERVAL_S))
        wait_for(lambda: old.alive() and new.alive() and _runs(old) and _runs(new),
                 lambda: f"both pools' worker processes run: {old.output[-2000:]}", 30)  # fmt: skip
        with CounterLog(counter) as log:
            wf = _diamond_and_fan_in(100)
            run = wf.enqueue()
            enqueued = time.monotonic()
            tally.ids = [node.id for node in wf.nodes]
            wait_for_drain(new, tally, 40, "every task of the workflow ran")
            drained_in = time.monotonic() - enqueued
            old.alive()
        counts = log.counts
        old_names = set(re.findall(r"Worker process (\S+) started", old.output))
    finally:
        old.close()

    tally.assert_each_ran_once()
    longest_wait = _assert_each_child_started_after_its_parents_finished(wf, counts)
    # Released by an acknowledgement at once, or by the sweeper within its interval.
    assert longest_wait < SWEEP_INTERVAL_S + SLACK_S, f"a child waited {longest_wait:.1f} s after its parents"
    ran_by = {node.name: tally.backend.get_result(node.id).worker_ids[-1] for node in wf.nodes}
    by_old = {name for name, worker in ran_by.items() if worker in old_names}
    assert 0 < len(by_old) < len(wf.nodes), f"the old release ran {len(by_old)} of {len(wf.nodes)} tasks"
    # A parent the old release acknowledged: before workflows, only this release's sweeper released its child.
    assert by_old - {"join"}, by_old
    run.refresh()
    print(
        f"\n{commit} beside this release: {len(wf.nodes)} tasks enqueued, {len(tally.ran())} ran, "
        f"{len(tally.ran_twice())} twice, {len(tally.never_ran())} lost, {len(by_old)} by the old release; "
        f"drained in {drained_in:.1f} s, the longest wait after a last parent {longest_wait:.2f} s; "
        f"the record counts {run.counts}"
    )
    if commit == LANDED_MAIN:
        assert run.status == TaskResultStatus.SUCCESSFUL and run.counts["SUCCESSFUL"] == len(wf.nodes), run.counts
    else:
        # The known gap (docs/explanation/workflows.md): a leaf the old release finished is never counted.
        assert run.counts["SUCCESSFUL"] == len(wf.nodes) - ("join" in by_old), run.counts


@pytest.fixture(scope="module")
def landed_main() -> Iterator[Path]:
    """A worktree of the landed main this release follows (workflows and per-task limits, not limited nodes)."""
    yield from _release_tree(LANDED_MAIN)


def test_the_landed_main_s_pool_beside_this_one_holds_a_workflow_s_limited_tasks_to_their_limit(
    landed_main, fault_server, counter, counter_server, start_pool, settings
):
    # This release stores a limited node as a limited enqueue stores a task; the landed main's acquire reads that.
    from tests.tasks import count_concurrent_three_at_a_time, count_run

    settings.TASKS = {"default": {**settings.TASKS["default"], "REDIS_URL": fault_server.url}}
    tally = Tally(task_backends["default"], counter)
    old = PreviousReleasePool(landed_main, "-w", "1", "-t", "4", env=fault_env(fault_server, counter_server.url))
    try:
        new = start_pool(fault_server, "-w", "1", "-t", "4")
        wait_for(lambda: old.alive() and new.alive() and _runs(old) and _runs(new),
                 lambda: f"both pools' worker processes run: {old.output[-2000:]}", 30)  # fmt: skip
        wf = Workflow(name="limited beside the landed main")
        root = wf.add(count_run, name="root")
        limited = [
            wf.add(count_concurrent_three_at_a_time, kwargs={"sleep_ms": 40}, after=[root], name=f"c{i}")
            for i in range(40)
        ]
        wf.add(count_run, after=limited, name="join")
        run = wf.enqueue()
        tally.ids = [node.id for node in wf.nodes]
        wait_for_drain(new, tally, 40, "every task of the workflow ran")
        old_names = set(re.findall(r"Worker process (\S+) started", old.output))
    finally:
        old.close()

    tally.assert_each_ran_once()
    peak = int(counter.get("limits:peak") or 0)
    assert peak == 3, f"peak running at once {peak} across both pools' 8 threads, limit 3"
    by_old = [n.name for n in limited if tally.backend.get_result(n.id).worker_ids[-1] in old_names]
    assert 0 < len(by_old) < len(limited), f"the landed main ran {len(by_old)} of the {len(limited)} limited tasks"
    run.refresh()
    assert run.status == TaskResultStatus.SUCCESSFUL, run.counts
    print(f"\n{LANDED_MAIN} beside this release: peak {peak} of limit 3; the landed main ran {len(by_old)} of 40")
