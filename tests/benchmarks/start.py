"""Start benchmark: from a worker's exec to its first task, and a one-task `--exit-empty` run.

Each sample empties the server, enqueues one probe task from a process of its own, then
starts the worker (one process, one thread). *First task* runs from just before the
worker's exec to the task's first statement, which records `time.time()`
(tests/benchmarks/probe.py); both clocks are this machine's. *Exit* runs from the same
moment to the worker's exit, for the workers that exit once their queues are empty
(threadmill `--exit-empty`, rq `--burst`); a worker that keeps running is stopped with
SIGTERM once its task started. Rows run one after the other on the same Valkey, repeats
interleaved, after one round that is not counted (it fills the page cache); each figure is
the median of the repeats. The ratio is against dramatiq's first task in the same run.
Threadmill runs twice: under the demo site's settings (the console's apps installed) and
under a new project's (`tests.settings_project`). The floor row is no worker: under the new
project's settings it does what `manage.py` does before a command's own code (Django's
management import and `django.setup()`), imports redis-py, and runs the probe's first
statement itself (`start_floor.py`): the part of a start no Django worker can cut.

`python -m tests.benchmarks start [--repeats N] [--peers dramatiq,rq,...] [--against REV]`;
`--against` adds threadmill's rows at an older commit, run from a temporary worktree in the
same run. The figures go to results/start.json.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from . import probe, report
from .drain import ROOT, Context, children_cpu_s, stop
from .latency import session
from .peers import PROBE_DB, RQ_WORKER_DB
from .server import server_version

#: Peers measured beside threadmill unless told otherwise.
DEFAULT_PEERS = ["dramatiq", "rq", "celery", "huey"]
#: Samples per row; the median is reported.
DEFAULT_REPEATS = 7
#: Seconds a worker may take to start its first task, and then to exit.
TIMEOUT_S = 60.0
#: The peer whose first task the ratios are against.
BASELINE = "dramatiq"

_ENQUEUE = "import sys; from tests.benchmarks.probe import sender; sender(sys.argv[1])(sys.argv[2], None)"


@dataclass(frozen=True)
class Row:
    """A worker under test: its command, what enqueues its probe task, and whether it exits when empty."""

    name: str
    system: str
    worker: list[str]
    settings: str | None = None
    exits_when_empty: bool = False
    #: The checkout the worker runs from (another commit's, with --against).
    tree: Path = ROOT


#: The threadmill worker every threadmill row runs.
THREADMILL = ["manage.py", "threadmill", "worker", "--exit-empty", "-w", "1", "-t", "1", "-q", "default"]


def threadmill_rows(tree: Path = ROOT, tag: str = "") -> list[Row]:
    """Return threadmill's rows, under the demo site's settings and a new project's, run from `tree`."""
    return [
        Row(f"threadmill{tag}, demo site", "threadmill", THREADMILL, "tests.benchmarks.settings", True, tree),
        Row(f"threadmill{tag}, new project", "threadmill", THREADMILL, "tests.settings_project", True, tree),
    ]


#: The floor: Django's set-up under a new project's settings and redis-py's import, then the probe task at once.
FLOOR = Row(
    "floor: Django set-up + redis-py import", "threadmill", ["-m", "tests.benchmarks.start_floor", "{token}"],
    "tests.settings_project", True,
)  # fmt: skip


def rows(server_url: str, peers: list[str]) -> list[Row]:
    """Return the rows to measure: threadmill under both settings, the floor, then each peer asked for."""
    rq_url = f"{server_url.rsplit('/', 1)[0]}/{RQ_WORKER_DB}"
    known = {
        "dramatiq": Row("dramatiq", "dramatiq", ["-m", "dramatiq", "tests.benchmarks.peers.dramatiq_app",
                                                 "-p", "1", "-t", "1", "-Q", "default"]),
        "rq": Row("rq --burst", "rq", ["-m", "rq.cli", "worker", "--burst", "--url", rq_url, "default"],
                  exits_when_empty=True),
        "celery": Row("celery", "celery", ["-m", "celery", "-A", "tests.benchmarks.peers.celery_app", "worker",
                                           "-P", "solo", "-Q", "default", "-l", "WARNING", "--without-gossip",
                                           "--without-mingle", "--without-heartbeat"]),
        "huey": Row("huey", "huey", ["-m", "huey.bin.huey_consumer", "tests.benchmarks.peers.huey_app.huey",
                                     "-w", "1", "-k", "thread"]),
    }  # fmt: skip
    unknown = set(peers) - known.keys()
    if unknown:
        raise ValueError(f"Unknown peers: {', '.join(sorted(unknown))}; choose from {', '.join(known)}.")
    return [*threadmill_rows(), FLOOR, *(known[name] for name in peers)]


@contextlib.contextmanager
def checkout(rev: str | None, scratch: Path) -> Iterator[list[Row]]:
    """Check `rev` out into a temporary worktree and yield its threadmill rows (none without a rev)."""
    if rev is None:
        yield []
        return
    tree = scratch / "against"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
    try:
        # An older tree may predate the new project's settings; they name nothing of its code.
        shutil.copy(ROOT / "tests" / "settings_project.py", tree / "tests" / "settings_project.py")
        yield threadmill_rows(tree, f" at {rev}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def sample(ctx: Context, row: Row, token: str) -> dict[str, float]:
    """Enqueue one probe task, start `row`'s worker, and return its figures (seconds).

    `first_task_s` and, for a worker that exits when empty, `exit_s`; `cpu_s` is the CPU the
    worker's processes used until they exited (a stopped worker's shutdown included), which a
    busy machine stretches less than it stretches the wall clock.
    """
    ctx.client.flushall()
    env = compiled(ctx.env(row.settings, {}), ctx)
    subprocess.run([sys.executable, "-c", _ENQUEUE, row.system, token], cwd=row.tree, env=env, check=True)
    probes = ctx.db(PROBE_DB)
    with open(ctx.scratch / f"{row.system}.log", "a") as log:
        cpu_before, before = children_cpu_s(), time.time()
        worker = subprocess.Popen(
            [sys.executable, *(arg.format(token=token) for arg in row.worker)], cwd=row.tree, env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            figures = {"first_task_s": first_start(probes, token, worker) - before}
            if row.exits_when_empty:
                code = wait_for_exit(worker)
                figures["exit_s"] = time.time() - before
                if code != 0:
                    raise RuntimeError(f"{row.name} exited with code {code}; its log is in {ctx.scratch}.")
        finally:
            stop(worker, timeout=15)
    figures["cpu_s"] = children_cpu_s() - cpu_before
    return figures


def compiled(env: dict[str, str], ctx: Context) -> dict[str, str]:
    """Return `env` with bytecode cached in the scratch directory, for every row alike.

    Without the cache (PYTHONDONTWRITEBYTECODE, as this machine's shells set) a checkout's
    modules are compiled at every start, and an installed package's are not: that, not the
    worker, was most of the difference.
    """
    env = {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(ctx.scratch / "pycache")}


def wait_for_exit(worker: subprocess.Popen) -> int:
    """Block until `worker` exits and return its code; kill it after TIMEOUT_S.

    A blocking wait, not `Popen.wait(timeout)`: that one polls with sleeps doubling from 1 ms to
    50 ms, which put an exit 30 ms after the first task up to 30 ms later still.
    """
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        worker.kill()

    watchdog = threading.Timer(TIMEOUT_S, kill)
    watchdog.start()
    try:
        code = worker.wait()
    finally:
        watchdog.cancel()
    if timed_out.is_set():
        raise TimeoutError(f"The worker did not exit within {TIMEOUT_S:.0f} s of its first task.")
    return code


def first_start(probes: redis.Redis, token: str, worker: subprocess.Popen) -> float:
    """Block until the probe task `token` started and return when it did (epoch seconds)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if probes.blpop([probe.DONE_KEY], timeout=1):
            return float(probes.hget(probe.STARTS_KEY, token))
        if worker.poll() is not None:
            raise RuntimeError(f"The worker exited with code {worker.returncode} before its task started.")
    raise TimeoutError(f"The probe task {token} did not start within {TIMEOUT_S:.0f} s.")


def run(
    repeats: int = DEFAULT_REPEATS, peer_names: list[str] | None = None, against: str | None = None
) -> dict[str, Any]:
    """Measure every row's start `repeats` times, interleaved, and print and write the medians.

    `against` names a commit whose threadmill rows run too, from a temporary worktree.
    """
    with session() as ctx, checkout(against, ctx.scratch) as older:
        measured = [*rows(ctx.server.url, DEFAULT_PEERS if peer_names is None else peer_names), *older]
        samples: dict[str, list[dict[str, float]]] = {row.name: [] for row in measured}
        for repeat in range(-1, repeats):
            for row in measured:
                figures = sample(ctx, row, f"start-{repeat}")
                if repeat >= 0:
                    samples[row.name].append(figures)
                    shown = ", ".join(f"{key} {value:.3f}" for key, value in figures.items())
                    print(f"[{repeat + 1}/{repeats}] {row.name}: {shown}", flush=True)
        version = server_version(ctx.client)
    queues = {row.name: summarise(row, samples[row.name]) for row in measured}
    figures = {"server": version, "repeats": repeats, "baseline": BASELINE, "against": against, "queues": queues}
    print_start(figures)
    print(f"\nwrote {report.write_results('start', figures)}")
    return figures


def summarise(row: Row, measured: list[dict[str, float]]) -> dict[str, Any]:
    summary: dict[str, Any] = {"worker": " ".join(row.worker), "settings": row.settings}
    for key in ("first_task_s", "exit_s", "cpu_s"):
        values = [m[key] for m in measured if key in m]
        if values:
            summary[key] = round(report.median(values), 4)
            summary[f"{key}_spread"] = report.spread(values)
    summary["samples"] = measured
    return summary


def print_start(figures: dict[str, Any]) -> None:
    queues = figures["queues"]
    base = next((q["first_task_s"] for name, q in queues.items() if name.startswith(BASELINE)), None)
    table = []
    for name, q in queues.items():
        exit_s = f"{q['exit_s']:.3f}" if "exit_s" in q else "-"
        ratio = f"{q['first_task_s'] / base:.2f}" if base else "-"
        table.append([name, f"{q['first_task_s']:.3f}", q["first_task_s_spread"], ratio, exit_s, f"{q['cpu_s']:.3f}"])
    report.print_table(
        f"start, 1 process x 1 thread, exec to the first task and to the exit of a one-task run, median of "
        f"{figures['repeats']} ({figures['server']})",
        ["queue", "first task s", "spread", f"vs {BASELINE}", "exit s", "CPU s"],
        table,
    )
