"""Drain benchmark: one worker process with one thread draining a queue of echo tasks.

Every queue under test runs against the same Valkey (its own database numbers) in the
same run, repeats interleaved so a noisy neighbour hits them alike. Each drain enqueues
its tasks from a separate process, starts the worker, and watches the stored results:
the rate is the tasks finished between the first and the last observed result divided by
that time, so a worker's start and stop cost are left out for every queue the same way.
CPU per task is the worker process tree's CPU over that same window (psutil), and the
server's CPU is read the same way from the Valkey process.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from threadmill.backends.keys import KeySchema
from threadmill.base import Segment

from . import peers, report
from .server import command_stats, server_cpu_s, server_version, valkey

ROOT = Path(__file__).resolve().parents[2]
#: Seconds between two reads of a queue's finished count.
POLL_S = 0.01
#: Tasks per drain unless a queue says otherwise.
DEFAULT_DEPTH = 20_000
#: Prefetch every queue that can be told reads ahead (the seeds' shared rate).
PEER_PREFETCH = 128
#: Peers drained beside threadmill unless told otherwise.
DEFAULT_PEERS = ["dramatiq", "celery", "django-tasks-db", "django-tasks-rq"]
#: Pool shapes (processes, threads) drained beside the one-process, one-thread rows.
POOL_SHAPES = ((2, 1), (1, 4))
#: The time limit of the drain row that puts one on every task, seconds (far above an echo's run).
BENCH_TASK_TIMEOUT_S = 60.0
#: The limits of the drain rows that set one that never binds: (row suffix, OPTIONS["limits"] JSON).
NON_BINDING_LIMITS = (
    ("concurrency 10000", '{"default": {"concurrency": 10000}}'),
    ("rate 100000 per s", '{"default": {"rate": "100000/s"}}'),
)
#: The drain rows whose every task carries a per-task limit that never binds: (row suffix, its JSON).
NON_BINDING_TASK_LIMITS = (
    ("task concurrency 10000", '{"concurrency": 10000}'),
    ("task rate 100000 per s", '{"rate": "100000/s"}'),
)
WORKER_COMMAND = ROOT / "threadmill" / "management" / "commands" / "threadmill.py"


@dataclass
class Context:
    """What every queue under test shares in one run: the server and a scratch directory."""

    server: Any
    scratch: Path
    client: redis.Redis = field(init=False)

    def __post_init__(self) -> None:
        self.client = redis.Redis.from_url(self.server.url)

    def db(self, number: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.server.port, db=number)

    @property
    def sqlite_path(self) -> Path:
        return self.scratch / "django-tasks-db.sqlite3"

    def env(self, settings: str | None, extra: dict[str, str]) -> dict[str, str]:
        env = {**os.environ, "BENCH_REDIS_URL": self.server.url, "THREADMILL_TEST_REDIS_URL": self.server.url}
        env["BENCH_SQLITE_PATH"] = str(self.sqlite_path)
        env.pop("DJANGO_SETTINGS_MODULE", None)
        if settings:
            env["DJANGO_SETTINGS_MODULE"] = settings
        return {**env, **extra}


@dataclass(frozen=True)
class QueueUnderTest:
    """One row of the table: how to fill a queue, drain it, and count what finished."""

    name: str
    system: str
    worker: list[str]
    finished: Callable[[Context], int]
    depth: int = DEFAULT_DEPTH
    settings: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    exits_when_drained: bool = False
    prepare: Callable[[Context, QueueUnderTest], None] | None = None
    reset: Callable[[Context], None] | None = None
    #: Whether the worker forks a short-lived child per task, which a psutil snapshot misses.
    forks_per_task: bool = False
    note: str = ""


# -- counting finished tasks --------------------------------------------------------------


def threadmill_finished(ctx: Context) -> int:
    return ctx.client.zcount(KeySchema("default").segment("default", Segment.SUCCESSFUL), "-inf", "+inf")


def dramatiq_finished(ctx: Context) -> int:
    return ctx.db(peers.DRAMATIQ_RESULTS_DB).dbsize()


def celery_finished(ctx: Context) -> int:
    return ctx.db(peers.CELERY_RESULTS_DB).dbsize()


def db_finished(ctx: Context) -> int:
    with sqlite3.connect(f"file:{ctx.sqlite_path}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(
            "SELECT COUNT(*) FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'"
        ).fetchone()[0]


def rq_finished(ctx: Context) -> int:
    return ctx.db(peers.RQ_DB).zcount("rq:finished:default", "-inf", "+inf")


def db_migrate(ctx: Context, queue: QueueUnderTest) -> None:
    command = [sys.executable, "manage.py", "migrate", "-v", "0"]
    subprocess.run(command, cwd=ROOT, env=ctx.env(queue.settings, {}), check=True)


def db_reset(ctx: Context) -> None:
    with sqlite3.connect(ctx.sqlite_path, timeout=30) as conn:
        conn.execute("DELETE FROM django_tasks_database_dbtaskresult")


# -- the queues ---------------------------------------------------------------------------


def threadmill_worker(workers: int = 1, threads: int = 1) -> list[str]:
    """Return the command of a threadmill pool that drains the default queue and exits."""
    shape = ["-w", str(workers), "-t", str(threads)]
    return ["manage.py", "threadmill", "worker", "--exit-empty", *shape, "-q", "default"]


def threadmill_queue(
    name: str,
    arguments: list[str],
    note: str,
    depth: int,
    workers: int = 1,
    threads: int = 1,
    extra_env: dict[str, str] | None = None,
) -> QueueUnderTest:
    """Return a threadmill row: a pool of `workers` x `threads` run with `arguments` (and `extra_env`)."""
    return QueueUnderTest(
        name=name,
        system="threadmill",
        worker=[*threadmill_worker(workers, threads), *arguments],
        finished=threadmill_finished,
        depth=depth,
        settings="tests.settings",
        exits_when_drained=True,
        note=note,
        extra_env=extra_env or {},
    )


def threadmill_queues(depth: int, extra_prefetch: list[int]) -> list[QueueUnderTest]:
    variants = [
        threadmill_queue("threadmill", [], "default prefetch (auto: sized by time)", depth),
        threadmill_queue("threadmill --prefetch-count 1", ["--prefetch-count", "1"], "no batching", depth),
    ]
    # The cost of a time limit: every task armed on the watchdog (the lease outlasts it: no round trip).
    variants.append(
        threadmill_queue(
            f"threadmill task_timeout {BENCH_TASK_TIMEOUT_S:g} s",
            [],
            "a time limit on every task, default prefetch",
            depth,
            extra_env={"THREADMILL_TEST_TASK_TIMEOUT": str(BENCH_TASK_TIMEOUT_S)},
        )
    )
    # The cost of limits that never bind: acquire counts the running segment, or keeps lease times.
    for suffix, limits in NON_BINDING_LIMITS:
        note = "a limit that never binds, default prefetch"
        variants.append(
            threadmill_queue(f"threadmill {suffix}", [], note, depth, extra_env={"THREADMILL_TEST_LIMITS": limits})
        )
    # Per-task limits: acquire looks at each task's path, counts the path's runs or keeps its lease times.
    for suffix, limit in NON_BINDING_TASK_LIMITS:
        note = "a per-task limit that never binds, default prefetch"
        extra = {"THREADMILL_BENCH_TASK_LIMIT": limit}
        variants.append(threadmill_queue(f"threadmill {suffix}", [], note, depth, extra_env=extra))
    # How the pool scales on this machine: a second process, or four threads in one.
    for workers, threads in POOL_SHAPES:
        name = f"threadmill -w {workers} -t {threads}"
        variants.append(threadmill_queue(name, [], "pool scaling, default prefetch", depth, workers, threads))
    for count in extra_prefetch:
        note = "diagnostic: the peers' read-ahead" if count == PEER_PREFETCH else "diagnostic"
        arguments = ["--prefetch-count", str(count)]
        variants.append(threadmill_queue(f"threadmill --prefetch-count {count}", arguments, note, depth))
    return variants


def worker_rejects(arguments: list[str], settings: str = "tests.settings") -> str | None:
    """Return why `threadmill worker` refuses `arguments` (its error line), or None when it takes them.

    `--help` after the arguments parses them first and exits 0 without starting a pool, so a
    flag this checkout's worker does not know yet is found in a second, before any drain.
    """
    command = [sys.executable, "manage.py", "threadmill", "worker", *arguments, "--help"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {done.returncode}"


def peer_queues(depth: int, names: list[str]) -> list[QueueUnderTest]:
    queues = {
        "dramatiq": QueueUnderTest(
            name="dramatiq",
            system="dramatiq",
            worker=["-m", "dramatiq", "tests.benchmarks.peers.dramatiq_app", "-p", "1", "-t", "1", "-Q", "default"],
            finished=dramatiq_finished,
            depth=depth,
            extra_env={"dramatiq_queue_prefetch": str(PEER_PREFETCH)},
            note=f"prefetch {PEER_PREFETCH}, Results middleware",
        ),
        "celery": QueueUnderTest(
            name="celery",
            system="celery",
            worker=(
                "-m celery -A tests.benchmarks.peers.celery_app worker -P solo -c 1 -Q default"
                f" --prefetch-multiplier={PEER_PREFETCH} --without-gossip --without-mingle --without-heartbeat -l WARNING"
            ).split(),
            finished=celery_finished,
            depth=depth,
            note=f"solo pool, prefetch multiplier {PEER_PREFETCH}, redis results",
        ),
        "django-tasks-db": QueueUnderTest(
            name="django-tasks-db",
            system="django-tasks-db",
            worker=["manage.py", "db_worker", "--batch", "--no-startup-delay", "--queue-name", "default"],
            finished=db_finished,
            depth=min(depth, 5_000),
            settings="tests.benchmarks.peers.db_settings",
            exits_when_drained=True,
            prepare=db_migrate,
            reset=db_reset,
            note="db_worker on SQLite, one task per loop",
        ),
        "django-tasks-rq": QueueUnderTest(
            name="django-tasks-rq",
            system="django-tasks-rq",
            worker=["manage.py", "rqworker", "default", "--burst", "--job-class", "django_tasks_rq.Job"],
            finished=rq_finished,
            depth=min(depth, 1_000),
            settings="tests.benchmarks.peers.rq_settings",
            exits_when_drained=True,
            forks_per_task=True,
            note="rqworker as shipped: a forked work horse per task",
        ),
    }
    unknown = set(names) - queues.keys()
    if unknown:
        raise ValueError(f"Unknown peers: {', '.join(sorted(unknown))}; choose from {', '.join(queues)}.")
    return [queues[name] for name in names]


# -- one drain ----------------------------------------------------------------------------


def tree_cpu_s(pid: int) -> dict[int, float]:
    """Return the CPU seconds of a process and each of its live descendants, by pid."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    cpu = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        cpu[process.pid] = times.user + times.system
    return cpu


def stop(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Ask a worker we started to shut down (SIGTERM to its session), then kill it if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def drain_interleaved(
    ctx: Context, queues: list[QueueUnderTest], repeats: int, runs: dict[str, list[dict[str, float]]]
) -> None:
    """Drain every queue `repeats` times, one of each in turn, appending each drain's figures to `runs`."""
    for repeat in range(repeats):
        for queue in queues:
            figures = drain_once(ctx, queue, timeout=queue.depth / 20 + 120)
            runs[queue.name].append(figures)
            print(
                f"[{repeat + 1}/{repeats}] {queue.name}: {figures['tasks_per_s']:,.0f} tasks/s, "
                f"{figures['cpu_us_per_task']:.0f} us CPU per task",
                flush=True,
            )


def drain_once(
    ctx: Context, queue: QueueUnderTest, timeout: float, worker_env: dict[str, str] | None = None, tag: str = ""
) -> dict[str, float]:
    """Fill the queue, run its worker until every task finished, and return the drain's figures.

    `worker_env` is added to the worker's environment only, not the filler's: the remote
    benchmark points the worker at a delay proxy while the tasks go straight to the server.
    """
    ctx.client.flushall()
    if queue.reset:
        queue.reset(ctx)
    env = ctx.env(queue.settings, queue.extra_env)
    enqueue = [sys.executable, "-m", "tests.benchmarks.enqueue", queue.system, str(queue.depth)]
    subprocess.run(enqueue, cwd=ROOT, env=env, check=True)
    log_path = ctx.scratch / f"{queue.name.replace(' ', '_')}{tag}.log"
    ctx.client.config_resetstat()
    cpu_before = children_cpu_s()
    with open(log_path, "w") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, *queue.worker], cwd=ROOT, env={**env, **(worker_env or {})}, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            first, last = watch(ctx, queue, process, started + timeout, log_path)
            if queue.exits_when_drained:
                process.wait(timeout=60)
                exited = time.perf_counter()
            else:
                exited = time.perf_counter()
                stop(process)
        finally:
            if process.poll() is None:
                stop(process)
    if queue.exits_when_drained and process.returncode != 0:
        raise RuntimeError(f"{queue.name} exited with {process.returncode}; see {log_path}")
    commands = command_stats(ctx.client)
    tasks = last["done"] - first["done"]
    seconds = last["at"] - first["at"]
    worker_cpu_total = children_cpu_s() - cpu_before
    if not queue.forks_per_task and first["cpu"].keys() <= last["cpu"].keys():
        window_cpu, cpu_window = sum(last["cpu"].values()) - sum(first["cpu"].values()), "first to last result"
    else:
        # A process of the tree exited before the last reading (an --exit-empty worker can
        # beat the poll, a forking worker's children come and go between polls): count the
        # tree's CPU up to its exit instead, from the rusage of the reaped processes.
        window_cpu, cpu_window = worker_cpu_total - sum(first["cpu"].values()), "first result to exit"
    root = process.pid
    root_cpu = last["cpu"].get(root, 0.0) - first["cpu"].get(root, 0.0)
    return {
        "tasks_per_s": tasks / seconds,
        # The process we started (threadmill's supervisor, dramatiq's and celery's main process)
        # against its descendants (the worker processes that run the tasks).
        "root_process_cpu_us_per_task": root_cpu / tasks * 1e6 if cpu_window == "first to last result" else None,
        "cpu_us_per_task": window_cpu / tasks * 1e6,
        "cpu_window": cpu_window,
        "server_cpu_us_per_task": (last["server_cpu"] - first["server_cpu"]) / tasks * 1e6,
        "window_tasks": tasks,
        "window_s": seconds,
        "first_result_after_s": first["at"] - started,
        "exit_after_last_result_s": exited - last["at"],
        "worker_cpu_total_s": worker_cpu_total,
        # Whole drain, start to stop, over every task: the server's view of the worker's traffic.
        "redis_commands_per_task": sum(c["calls"] for c in commands.values()) / queue.depth,
        "evalsha_per_task": commands.get("evalsha", {"calls": 0})["calls"] / queue.depth,
        "redis_calls_per_task": {name: round(c["calls"] / queue.depth, 3) for name, c in sorted(commands.items())},
    }


def watch(
    ctx: Context, queue: QueueUnderTest, process: subprocess.Popen, deadline: float, log_path: Path
) -> tuple[dict[str, float], dict[str, float]]:
    """Poll the finished count; return readings at the first and the last observed result."""
    first = None
    while True:
        done = queue.finished(ctx)
        now = time.perf_counter()
        if done and first is None:
            first = reading(ctx, process, done, now)
        if done >= queue.depth:
            last = reading(ctx, process, done, now)
            break
        if process.poll() is not None and queue.finished(ctx) < queue.depth:
            raise RuntimeError(f"{queue.name} exited with {process.returncode} after {done} tasks; see {log_path}")
        if now > deadline:
            raise RuntimeError(f"{queue.name} finished {done} of {queue.depth} tasks in time; see {log_path}")
        time.sleep(POLL_S)
    if first["done"] >= queue.depth:
        raise RuntimeError(f"{queue.name} finished all {queue.depth} tasks between two polls: raise the depth.")
    return first, last


def reading(ctx: Context, process: subprocess.Popen, done: int, now: float) -> dict[str, float]:
    return {"done": done, "at": now, "cpu": tree_cpu_s(process.pid), "server_cpu": server_cpu_s(ctx.server)}


# -- the run ------------------------------------------------------------------------------


def queues_under_test(depth: int, peer_names: list[str], extra_prefetch: list[int]) -> list[QueueUnderTest]:
    """Return threadmill's rows (once its worker command exists) followed by the peers'."""
    if not WORKER_COMMAND.exists():
        print(f"threadmill skipped: {WORKER_COMMAND.relative_to(ROOT)} does not exist yet.", flush=True)
        return peer_queues(depth, peer_names)
    return threadmill_queues(depth, extra_prefetch) + peer_queues(depth, peer_names)


def run(
    depth: int = DEFAULT_DEPTH,
    repeats: int = 3,
    peer_names: list[str] | None = None,
    extra_prefetch: list[int] | None = None,
    only: list[str] | None = None,
    results_name: str = "drain",
) -> dict[str, Any]:
    """Drain every queue under test (or the rows named in `only`) `repeats` times, interleaved; print and write the medians."""
    peer_names = DEFAULT_PEERS if peer_names is None else peer_names
    extra_prefetch = [PEER_PREFETCH] if extra_prefetch is None else extra_prefetch
    queues = queues_under_test(depth, peer_names, extra_prefetch)
    if only is not None:
        queues = [q for q in queues if q.name in only]
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-drain-"))
    runs: dict[str, list[dict[str, float]]] = {q.name: [] for q in queues}
    with valkey() as server:
        ctx = Context(server, scratch)
        for queue in queues:
            if queue.prepare:
                queue.prepare(ctx, queue)
        drain_interleaved(ctx, queues, repeats, runs)
        version = server_version(ctx.client)
    # Kept when a drain fails, since the workers' logs there say why.
    shutil.rmtree(scratch, ignore_errors=True)
    results = add_paired_ratios({q.name: summarise(q, runs[q.name]) for q in queues})
    figures = {"server": version, "repeats": repeats, "poll_s": POLL_S, "queues": results}
    print_drain(figures)
    print(f"\nwrote {report.write_results(results_name, figures)}")
    return figures


def summarise(queue: QueueUnderTest, runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {}
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r[key], float | int)]
        if values:
            medians[key] = round(report.median(values), 3)
    return {"depth": queue.depth, "worker": " ".join(queue.worker), "note": queue.note, **medians, "runs": runs}


def add_paired_ratios(results: dict[str, Any], baseline: str = "threadmill") -> dict[str, Any]:
    """Add each row's median ratio to threadmill's figure of the same repeat.

    Repeats are interleaved, so the drains of one repeat share the machine's load of the
    moment. The median of those paired ratios holds up better on a noisy machine than a
    ratio of two medians.
    """
    if baseline not in results:
        return results
    base = results[baseline]["runs"]
    for entry in results.values():
        pairs = list(zip(entry["runs"], base, strict=True))
        entry["paired_tasks_per_s_ratio"] = round(
            report.median([r["tasks_per_s"] / b["tasks_per_s"] for r, b in pairs]), 3
        )
        entry["paired_cpu_ratio"] = round(
            report.median([r["cpu_us_per_task"] / b["cpu_us_per_task"] for r, b in pairs]), 3
        )
    return results


def print_drain(figures: dict[str, Any]) -> None:
    queues = figures["queues"]
    rows = []
    for name, entry in queues.items():
        rate = report.spread([r["tasks_per_s"] for r in entry["runs"]]).replace(".00", "")
        ratio_rate = f"{entry['paired_tasks_per_s_ratio']:.2f}x" if "paired_tasks_per_s_ratio" in entry else "-"
        ratio_cpu = f"{entry['paired_cpu_ratio']:.2f}x" if "paired_cpu_ratio" in entry else "-"
        rows.append([
            name, f"{entry['depth']:,}", f"{entry['tasks_per_s']:,.0f}", rate, f"{entry['cpu_us_per_task']:.0f}",
            f"{entry['server_cpu_us_per_task']:.0f}", f"{entry['redis_commands_per_task']:.1f}", ratio_rate, ratio_cpu,
        ])  # fmt: skip
    report.print_table(
        f"drain, 1 process x 1 thread, echo task, results stored ({figures['server']}, median of {figures['repeats']})",
        ["queue", "tasks", "tasks/s", "runs tasks/s", "worker us CPU/task", "server us CPU/task",
         "Redis cmds/task", "tasks/s vs threadmill (paired)", "CPU vs threadmill (paired)"],
        rows,
    )  # fmt: skip
