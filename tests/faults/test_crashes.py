"""Processes killed or stopped mid-drain: a worker process, the supervisor, `threadmill run`, a SIGTERM'd pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from django.tasks import TaskResultStatus

from tests import tasks
from tests.faults.conftest import FAULT_TIMEOUTS, KINDS, SLACK_S, Tally, kill_if_same, wait_for, wait_for_drain
from tests.output import LineReader
from tests.worker.conftest import ROOT
from threadmill.base import Segment
from threadmill.embedded import free_port
from threadmill.outcome import WORKER_LOSS_LIMIT

pytestmark = pytest.mark.slow

WORKER_TIMEOUT_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_WORKER_TIMEOUT"])
BROKER_INTERVAL_S = float(FAULT_TIMEOUTS["THREADMILL_TEST_BROKER_INTERVAL"])
#: "Within a few seconds": how long what a killed supervisor or `run` started may outlive it.
ORPHAN_LIFETIME_S = 5.0
#: Errors recording an attempt given up: WorkerLost is the AttemptAbandoned of a worker found dead.
ABANDONED_ERRORS = {"threadmill.exceptions.AttemptAbandoned", "threadmill.exceptions.WorkerLost"}
#: The --shutdown-timeout the SIGTERM test gives the pool, seconds.
SHUTDOWN_TIMEOUT_S = 2.0


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _error_classes(result) -> list[str]:
    return [error.exception_class_path for error in result.errors]


@pytest.mark.parametrize("fault_server", KINDS, indirect=True)
def test_kill_9_of_a_worker_process_runs_its_tasks_again_within_the_worker_timeout(
    tally: Tally, fault_server, start_pool
):
    tally.enqueue(400, sleep_ms=20)
    pool = start_pool(fault_server, "-w", "2", "-t", "2")
    wait_for(lambda: pool.alive() and tally.successful() >= 40, lambda: f"a drain is under way ({tally.summary()})", 30)
    victim = pool.children()[0]
    victim_name = pool.worker_name(victim)

    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: _dead(victim), lambda: "it dies", 5)
    held = tally.leased_by(victim_name)
    started, finished = tally.started(), tally.finished()
    assert held, "the killed process held no lease"

    wait_for(
        lambda: not tally.leased_by(victim_name),
        lambda: f"the {len(held)} tasks the killed process held are taken back ({tally.summary()})",
        WORKER_TIMEOUT_S + BROKER_INTERVAL_S + SLACK_S,
    )
    recovered_in = time.monotonic() - killed_at
    wait_for_drain(pool, tally, 30)

    # Only a task that had finished on the victim, its acknowledgement not yet sent, may run again.
    unacknowledged = {task_id for task_id in held if finished[task_id]}
    twice = tally.ran_twice()
    assert set(twice) <= unacknowledged and set(twice.values()) <= {2}, (
        f"ran twice: {twice}; only these {len(unacknowledged)} had finished unacknowledged: {unacknowledged}"
    )
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    for task_id in held:
        result = tally.backend.get_result(task_id)
        if started[task_id] and not finished[task_id]:
            # Running when it died: the lost attempt is recorded, the dead worker's id and an error naming it.
            assert victim_name in result.worker_ids, (task_id, result.worker_ids, _error_classes(result))
            abandoned = [e for e in result.errors if e.exception_class_path in ABANDONED_ERRORS]
            assert len(abandoned) == 1 and victim_name in abandoned[0].traceback, _error_classes(result)
    assert len(pool.children()) == 2 and victim not in pool.children()
    print(
        f"{len(held)} leases recovered in {recovered_in:.1f} s; {len(twice)} of {len(unacknowledged)} unacknowledged ran twice"
    )


def test_a_task_that_kills_its_worker_process_is_failed_after_three_kills_and_no_innocent_task_is(
    tally: Tally, fault_server, start_pool
):
    # Two threads busy with slower tasks keep the poison waiting in the buffer across a
    # heartbeat (every 0.5 s at worker_timeout 2 s) before it runs: that heartbeat lists it
    # as buffered, though it started, and innocent neighbours finish with their
    # acknowledgement pending or run beside it when it kills the process.
    tally.enqueue(4, sleep_ms=700)
    poison = tally.backend.enqueue(tasks.kill_own_process, [], {}).id
    tally.enqueue(12, sleep_ms=700)
    pool = start_pool(fault_server, "-w", "1", "-t", "2", "--prefetch-count", "4")

    def settled() -> bool:
        segments = tally.segments()
        return segments[Segment.SUCCESSFUL] + segments[Segment.FAILED] == len(tally.ids) + 1

    wait_for(
        lambda: pool.alive() and (tally.started()[poison] > WORKER_LOSS_LIMIT or settled()),
        lambda: f"the poison is failed and every other task ran ({tally.summary()}, {tally.started()[poison]} kills)",
        60,
    )

    assert tally.started()[poison] == WORKER_LOSS_LIMIT, f"the poison killed its worker {tally.started()[poison]} times"
    failed = tally.backend.get_result(poison)
    assert failed.status == TaskResultStatus.FAILED
    # The first kill may have gone unrecorded (its heartbeat saw the poison buffered); the count was kept on the server.
    assert set(_error_classes(failed)) == {"threadmill.exceptions.WorkerLost"}, _error_classes(failed)
    assert f"{WORKER_LOSS_LIMIT} lost workers in a row" in failed.errors[-1].traceback
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    assert len(pool.respawns()) == WORKER_LOSS_LIMIT, pool.respawns()


def test_kill_9_of_the_supervisor_stops_its_worker_processes_and_a_new_pool_runs_every_task(
    tally: Tally, fault_server, start_pool
):
    # Long enough that the buffers cannot be emptied within the few seconds the orphans have.
    tally.enqueue(24, sleep_ms=1500)
    # A fixed buffer: sized by time, 1.5 s tasks would be held 1 per thread and the rest handed back.
    pool = start_pool(fault_server, "-w", "2", "-t", "2", "--prefetch-count", "8")
    wait_for(
        lambda: pool.alive() and len(pool.children()) == 2 and tally.segments()[Segment.RUNNING] >= 12,
        lambda: f"both processes hold leases ({tally.summary()})",
        30,
    )
    orphans = [psutil.Process(pid) for pid in pool.children()]

    pool.process.kill()
    killed_at = time.monotonic()

    _, alive = psutil.wait_procs(orphans, timeout=ORPHAN_LIFETIME_S)
    assert alive == [], (
        f"worker processes {[p.pid for p in alive]} outlived their supervisor by {ORPHAN_LIFETIME_S:g} s"
    )
    stopped_in = time.monotonic() - killed_at
    assert tally.ran_twice() == {}, tally.summary()

    second = start_pool(fault_server, "-w", "2", "-t", "2")
    # The leases the orphans left (if any) are a dead worker's: recovered after worker_timeout.
    wait_for_drain(second, tally, WORKER_TIMEOUT_S + BROKER_INTERVAL_S + 24 * 1.5 / 4 + 2 * SLACK_S)

    tally.assert_each_ran_once()
    print(f"orphaned worker processes stopped {stopped_in:.1f} s after their supervisor was killed")


class RunCommand:
    """`manage.py threadmill run` on a free console port and a free embedded Valkey port."""

    def __init__(self, home) -> None:
        self.port, self.valkey_port = free_port(), free_port()
        env = {**os.environ, "THREADMILL_HOME": str(home)}
        for name in ("DJANGO_SETTINGS_MODULE", "REDIS_URL", "THREADMILL_TEST_REDIS_URL"):
            env.pop(name, None)
        command = [sys.executable, "manage.py", "threadmill", "run", "--no-demo", "--port", str(self.port)]
        command += ["--valkey-port", str(self.valkey_port), "--valkey-dir", str(home / "valkey")]
        command += ["-w", "1", "-t", "2", "--shutdown-timeout", "2"]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.output = LineReader(self.process.stdout)
        self.started: dict[int, float] = {}

    @property
    def lines(self) -> list[str]:
        return self.output.lines

    def wait_for_url(self, timeout: float = 60.0) -> None:
        if self.output.wait_for("Threadmill console: ", timeout) is None:
            pytest.fail(f"threadmill run printed no URL: {self.lines}")

    def alive(self) -> bool:
        """Fail the test at once, with everything `run` printed, if it exited."""
        if self.process.poll() is not None:
            self.output.wait_closed(10)
            pytest.fail(f"threadmill run exited with code {self.process.returncode}:\n" + "\n".join(self.lines))
        return True

    def descendants(self) -> list[psutil.Process]:
        """Every process `run` started, directly or not; remembered for the clean-up."""
        try:
            processes = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for process in processes:
            self.started.setdefault(process.pid, process.create_time())
        return processes

    def close(self) -> None:
        self.descendants()  # Learn them before the run goes: orphans are no longer its descendants.
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid, created in self.started.items():
            kill_if_same(pid, created)


def _kind(process: psutil.Process) -> str:
    """Name what `run` started: Valkey, the site, the pool (supervisor) or one of its worker processes."""
    try:
        command = " ".join(process.cmdline())
        parent = " ".join(process.parent().cmdline()) if process.parent() else ""
    except psutil.NoSuchProcess:
        return "gone"
    if "threadmill worker" in command:
        # A worker process is forked from the supervisor, so it shows the same command line.
        return "worker process" if "threadmill worker" in parent else "pool"
    return "site" if "daphne" in command else "valkey" if "valkey" in command else command


#: Everything `threadmill run -w 1` starts.
RUN_CHILDREN = ["pool", "site", "valkey", "worker process"]


def test_kill_9_of_threadmill_run_stops_everything_it_started(tmp_path):
    run = RunCommand(tmp_path)
    try:
        run.wait_for_url()
        valkey_line = next((line for line in run.lines if line.startswith("Embedded Valkey listening on")), "")
        assert f":{run.valkey_port}/" in valkey_line, f"run ignored --valkey-port: {valkey_line!r}"
        wait_for(
            lambda: run.alive() and sorted(_kind(p) for p in run.descendants()) == RUN_CHILDREN,
            lambda: f"run started everything: {sorted(_kind(p) for p in run.descendants())}",
            30,
        )
        started = run.descendants()

        run.process.kill()

        _, alive = psutil.wait_procs(started, timeout=ORPHAN_LIFETIME_S)
        assert alive == [], (
            f"{sorted(_kind(p) for p in alive)} outlived `threadmill run` by {ORPHAN_LIFETIME_S:g} s after its SIGKILL"
        )
    finally:
        run.close()


def test_sigterm_hands_buffered_tasks_back_at_once_and_the_running_one_after_the_shutdown_timeout(
    tally: Tally, fault_server, start_pool
):
    long_task = tally.enqueue(1, task=tasks.count_run.using(priority=10), first_attempt_sleep_ms=120_000)[0]
    tally.enqueue(20, sleep_ms=20)
    pool = start_pool(
        fault_server, "-w", "1", "-t", "1", "--prefetch-count", "4", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)
    )
    wait_for(
        lambda: pool.alive() and tally.started()[long_task] and tally.segments()[Segment.RUNNING] >= 4,
        lambda: f"the long task runs and the buffer is full ({tally.summary()})",
        30,
    )
    name = pool.worker_names()[0]
    buffered = [task_id for task_id in tally.leased_by(name) if task_id != long_task]
    assert buffered, "nothing was buffered"

    pool.process.send_signal(signal.SIGTERM)
    signalled_at = time.monotonic()

    # Handed back at once: well before the shutdown timeout is up.
    wait_for(
        lambda: all(tally.segment_of(i) == "ready" for i in buffered),
        lambda: f"the buffered tasks are ready again ({tally.summary()})",
        SHUTDOWN_TIMEOUT_S / 2,
    )
    for task_id in buffered:
        result = tally.backend.get_result(task_id)
        assert (result.attempts, result.errors, tally.started()[task_id]) == (0, [], 0), result.worker_ids
    code = pool.process.wait(SHUTDOWN_TIMEOUT_S + SLACK_S)
    exited_in = time.monotonic() - signalled_at
    assert code == 0, pool.output[-3000:]
    assert SHUTDOWN_TIMEOUT_S <= exited_in <= SHUTDOWN_TIMEOUT_S + SLACK_S, exited_in
    interrupted = tally.backend.get_result(long_task)
    # Back to ready, or to deferred if its retry policy asks for a pause before the next attempt.
    assert interrupted.segment in (Segment.READY, Segment.DEFERRED)
    assert interrupted.worker_ids == [name]
    assert _error_classes(interrupted) == ["threadmill.exceptions.AttemptAbandoned"]
    assert tally.finished()[long_task] == 0

    second = start_pool(fault_server, "-w", "1", "-t", "2")
    wait_for_drain(second, tally, 30)

    tally.assert_each_ran_once()
    assert tally.started()[long_task] == 2  # Interrupted once, then run to the end.
    assert _error_classes(tally.backend.get_result(long_task)) == ["threadmill.exceptions.AttemptAbandoned"]
