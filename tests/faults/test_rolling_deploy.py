"""A rolling deploy: the previous release's worker pool and this one's on the same server, each killed once.

The previous release runs from a `git worktree` of its commit, with its own scripts, worker
names (`host:pid`) and stored fields. Each broker must recover the other release's leases,
and every task runs once, but for the tasks a killed process had finished and not yet
acknowledged. Counted on the counter server.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from django.tasks import TaskResultStatus

from tests.faults.conftest import Pool, Tally, fault_env, wait_for, wait_for_drain
from tests.worker.conftest import ROOT

pytestmark = pytest.mark.slow

#: The previous release: the last commit landed before worker names, suspects and the cron field.
PREVIOUS_RELEASE = "a7f2b45"


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """A worktree of the previous release, removed at the end."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("The rolling-deploy test runs the previous release from a git worktree: run it in a git checkout.")
    if not _has_commit(PREVIOUS_RELEASE):
        # A shallow clone (a CI checkout) lacks it: fetch the history from where it was cloned.
        subprocess.run(["git", "-C", str(ROOT), "fetch", "--quiet", "--unshallow"], check=False, capture_output=True)
    if not _has_commit(PREVIOUS_RELEASE):
        pytest.fail(f"The previous release {PREVIOUS_RELEASE} is not in this checkout; fetch the history (git fetch).")
    where = Path(tempfile.mkdtemp(prefix="threadmill-previous-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), PREVIOUS_RELEASE],
                   check=True, capture_output=True)  # fmt: skip
    yield where
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)
    shutil.rmtree(where.parent, ignore_errors=True)


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
    os.kill(victim, signal.SIGKILL)
    psutil.wait_procs([psutil.Process(victim)], timeout=5)


def test_old_and_new_pools_recover_each_other_s_leases_and_every_task_runs_once(
    tally: Tally, fault_server, counter_server, start_pool, previous_release
):
    tally.enqueue(300, sleep_ms=30)
    old = PreviousReleasePool(previous_release, "-w", "1", "-t", "2", env=fault_env(fault_server, counter_server.url))
    new = start_pool(fault_server, "-w", "1", "-t", "2")
    try:
        wait_for(lambda: old.alive() and new.alive() and tally.successful() >= 60,
                 lambda: f"both pools drain ({tally.summary()})", 30)  # fmt: skip
        may_run_twice = set(tally.finished())
        _kill_worker_process(old)
        wait_for(lambda: old.alive() and tally.successful() >= 150,
                 lambda: f"the drain goes on after the old worker's kill ({tally.summary()})", 30)  # fmt: skip
        may_run_twice |= set(tally.finished())
        _kill_worker_process(new)
        wait_for_drain(new, tally, 60)
        old.alive()
        old_log = old.output
    finally:
        old.close()

    # Only a task a killed process had finished, its acknowledgement not yet sent, may run again.
    twice = tally.ran_twice()
    assert set(twice) <= may_run_twice and len(twice) <= 8, f"ran twice: {twice}"
    assert tally.never_ran() == [], tally.summary()
    assert tally.statuses() == {TaskResultStatus.SUCCESSFUL: len(tally.ids)}, tally.summary()
    assert "respawning it" in old_log and "respawning it" in new.output
    # Really two releases: the old one names its processes host:pid, this one host:pid:incarnation.
    assert re.search(r"Worker process [^ :]+:\d+ started", old_log), old_log[-2000:]
    assert re.search(r"Worker process [^ :]+:\d+:[a-z]+ started", new.output), new.output[-2000:]
