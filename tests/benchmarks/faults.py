"""Fault benchmark: the issue's table, a fault 1.5 s into a drain, at the default settings.

Each row enqueues 2,000 tasks of 20 ms (`tests.tasks.count_run`) on a fresh persistent
Valkey, starts `threadmill worker -w 1 -t 4`, breaks something 1.5 s after the first
result, and watches until every task succeeded or 60 s after the fault. Every start and
finish of a task is counted on a second Valkey that no fault touches, so "run twice" is
what really ran. The pools run with the backend's defaults (lease_ttl 1 h, worker_timeout
15 s, broker_interval 1 s, socket_timeout 5 s) through tests.settings, whose only change
that matters here, a 50 ms longest poll, shortens idle waits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis

from threadmill.base import Segment
from threadmill.embedded import EmbeddedValkey, free_port

from . import report
from .server import server_version, valkey

ROOT = Path(__file__).resolve().parents[2]
#: Tasks per row, as in the issue.
DEFAULT_TASKS = 2_000
#: Each task's run time, milliseconds.
TASK_MS = 20
#: Seconds after the first result at which the fault strikes.
FAULT_AFTER_S = 1.5
#: Seconds after the fault the benchmark keeps watching.
OBSERVE_S = 60.0
#: The SIGTERM row's long task, seconds.
LONG_TASK_S = 120
#: Seconds the server stays down in the outage row.
OUTAGE_S = 10.0
#: Seconds the freeze row stops the worker process: twice the default worker_timeout.
FREEZE_S = 30.0
#: Tasks among the drain that call sys.exit() in the SystemExit row.
EXITING_TASKS = 10
#: Seconds between two readings of the stored results.
POLL_S = 0.1
#: The worker command of every row.
WORKER = ["manage.py", "threadmill", "worker", "-w", "1", "-t", "4", "--log-format", "text"]
#: What a namespaced pool runs under: a PID namespace of its own (as root), dying with unshare.
NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
#: Queues of tests.settings.
QUEUES = ["default", "emails", "reports"]


@dataclass
class Drain:
    """One row's moving parts: the server under test, the pool and its log."""

    server: EmbeddedValkey
    pool: subprocess.Popen
    log: Path
    client: redis.Redis
    #: Starts another pool like the first (the container row restarts it), appending to the log.
    start_pool: Callable[[], subprocess.Popen]


def worker_process(drain: Drain) -> int:
    """The pid of the pool's worker process, under the namespace's unshare or not."""
    supervisor = psutil.Process(drain.pool.pid)
    if supervisor.name() == "unshare":
        supervisor = supervisor.children()[0]
    return supervisor.children()[0].pid


def kill_worker_process(drain: Drain) -> None:
    """kill -9 the pool's worker process (the supervisor respawns it)."""
    os.kill(worker_process(drain), signal.SIGKILL)


def restart_server(drain: Drain) -> None:
    """Stop Valkey cleanly (SIGTERM writes its append-only file) and start it again."""
    drain.server.stop()
    drain.server.start()


def server_down(drain: Drain) -> None:
    """Stop Valkey, keep it down for `OUTAGE_S`, then start it again."""
    drain.server.stop()
    time.sleep(OUTAGE_S)  # The outage itself.
    drain.server.start()


def freeze_worker_process(drain: Drain) -> None:
    """SIGSTOP the pool's worker process for `FREEZE_S`, then SIGCONT it (the broker recovers its leases meanwhile)."""
    pid = worker_process(drain)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(FREEZE_S)  # The freeze itself.
    finally:
        os.kill(pid, signal.SIGCONT)


def restart_container(drain: Drain) -> None:
    """SIGKILL the pool's PID namespace (its pid 1, so the kernel kills every process in it) and start a new one.

    The new namespace hands out the same pids on the same host, as a container restart does.
    """
    init = psutil.Process(drain.pool.pid).children()[0]
    init.kill()
    drain.pool.wait()
    drain.pool = drain.start_pool()


def nothing(drain: Drain) -> None:
    """No fault from outside: the row's own tasks are the fault."""


def sigterm_pool(drain: Drain) -> None:
    """SIGTERM the pool, as an orchestrator stopping it would."""
    drain.pool.send_signal(signal.SIGTERM)


@dataclass(frozen=True)
class Fault:
    name: str
    strike: Callable[[Drain], None]
    #: Whether a 120 s task runs first, and the row measures the pool's exit instead of the drain.
    long_task: bool = False
    #: Tasks enqueued among the drain that call sys.exit(): they must end FAILED, run once.
    exiting: int = 0
    #: Whether the pool runs in a PID namespace of its own, as in a container.
    namespaced: bool = False
    #: Whether one task among the drain SIGKILLs its worker process each time it runs (a poison task).
    poison: bool = False


FAULTS = [
    Fault("kill -9 the worker process (the pool respawns it)", kill_worker_process),
    Fault("restart Valkey cleanly (SIGTERM, append-only file)", restart_server),
    Fault(f"Valkey down for {OUTAGE_S:g} s, then back", server_down),
    Fault(
        "kill -9 the pool's container (a fresh PID namespace) and start it again", restart_container, namespaced=True
    ),
    Fault(f"freeze the worker process {FREEZE_S:g} s (SIGSTOP, 2x worker_timeout)", freeze_worker_process),
    Fault(f"{EXITING_TASKS} tasks call sys.exit() among the drain", nothing, exiting=EXITING_TASKS),
    Fault("a poison task among the drain SIGKILLs its worker process each run", nothing, poison=True),
    Fault(f"SIGTERM to the pool while a {LONG_TASK_S} s task runs", sigterm_pool, long_task=True),
]


def setup_django() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def pool_env(server_url: str, counter_url: str) -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONUNBUFFERED": "1"}
    env.update(THREADMILL_TEST_REDIS_URL=server_url, THREADMILL_TEST_COUNTER_URL=counter_url)
    # The backend's defaults, over the test settings' short lease.
    env.update(
        THREADMILL_TEST_LEASE_TTL="3600",
        THREADMILL_TEST_WORKER_TIMEOUT="15",
        THREADMILL_TEST_BROKER_INTERVAL="1",
        THREADMILL_TEST_SOCKET_TIMEOUT="5",
    )
    return env


def enqueue(server_url: str, tasks: int, fault: Fault) -> list[str]:
    from tests.tasks import count_run, count_then_exit, kill_own_process
    from threadmill.backends.redis import RedisTaskBackend

    backend = RedisTaskBackend("default", {"REDIS_URL": server_url, "QUEUES": QUEUES})
    ids = []
    if fault.long_task:
        ids.append(backend.enqueue(count_run.using(priority=10), [], {"sleep_ms": LONG_TASK_S * 1000}).id)
    every = tasks // fault.exiting if fault.exiting else 0
    for i in range(tasks):
        exits = every and i % every == every // 2
        ids.append(
            backend.enqueue(count_then_exit if exits else count_run, [], {} if exits else {"sleep_ms": TASK_MS}).id
        )
    if fault.poison:
        # Behind a tenth of the drain: it waits in the buffer beside innocent tasks each time.
        ids.insert(tasks // 10, backend.enqueue(kill_own_process, [], {}).id)
    backend.client.close()
    return ids


def successful(client: redis.Redis) -> int | None:
    """Tasks stored as successful, or None while the server does not answer."""
    try:
        return client.zcard(f"threadmill:{{default}}:default:{Segment.SUCCESSFUL}")
    except redis.RedisError:
        return None


def tasks_before_poison(enqueued: int) -> int:
    """Where the poison row put its poison task among `enqueued` ids (the drain's tasks plus it)."""
    return (enqueued - 1) // 10


def settled(client: redis.Redis) -> int | None:
    """Tasks stored as successful or failed (nothing left to run), or None while the server does not answer."""
    try:
        pipe = client.pipeline(transaction=False)
        for segment in (Segment.SUCCESSFUL, Segment.FAILED):
            pipe.zcard(f"threadmill:{{default}}:default:{segment}")
        return sum(pipe.execute())
    except redis.RedisError:
        return None


def measure_once(fault: Fault, counter_url: str, tasks: int, scratch: Path) -> dict[str, Any]:
    """Run one drain through `fault` and return its row."""
    counter = redis.Redis.from_url(counter_url)
    counter.flushall()
    data_dir = tempfile.mkdtemp(prefix="valkey-", dir=scratch)
    server = EmbeddedValkey(data_dir, free_port(), persist=True).start()
    ids = enqueue(server.url, tasks, fault)
    log = scratch / "pool.log"
    log.write_text("")
    prefix = NAMESPACE if fault.namespaced else []

    def start_pool() -> subprocess.Popen:
        with open(log, "a") as out:
            return subprocess.Popen(
                [*prefix, sys.executable, *WORKER], cwd=ROOT, env=pool_env(server.url, counter_url),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    drain = Drain(server, start_pool(), log, redis.Redis.from_url(server.url, socket_timeout=1), start_pool)
    try:
        return observe(drain, fault, counter, ids)
    finally:
        # The pool leads its own process group: this ends its worker processes too, even
        # ones whose supervisor already exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(drain.pool.pid, signal.SIGKILL)
        drain.pool.wait()
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def observe(drain: Drain, fault: Fault, counter: redis.Redis, ids: list[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not successful(drain.client):
        if drain.pool.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"The pool ran nothing; see {drain.log}: {drain.log.read_text()[-2000:]}")
        time.sleep(POLL_S)
    time.sleep(FAULT_AFTER_S)  # The schedule of the fault, not a synchronisation.
    # From the start of the fault: an outage's own 10 s count, as they do for the tasks waiting.
    struck = time.monotonic()
    fault.strike(drain)
    all_ran_s = exited_s = None
    while time.monotonic() - struck < OBSERVE_S:
        if fault.long_task:
            if drain.pool.poll() is not None:
                exited_s = time.monotonic() - struck
                break
        elif settled(drain.client) == len(ids):
            all_ran_s = time.monotonic() - struck
            break
        time.sleep(POLL_S)
    finished = {key.decode(): int(n) for key, n in counter.hgetall("faults:finished").items()}
    started = {key.decode(): int(n) for key, n in counter.hgetall("faults:started").items()}
    done = settled(drain.client) or 0
    try:
        failed = drain.client.zcard(f"threadmill:{{default}}:default:{Segment.FAILED}")
    except redis.RedisError:
        failed = None
    # A task that calls sys.exit() never finishes: its one start is its run. The poison's starts are its kills.
    poison = ids[tasks_before_poison(len(ids))] if fault.poison else None
    runs = {
        task_id: max(finished.get(task_id, 0), started.get(task_id, 0) if fault.exiting else 0)
        for task_id in ids
        if task_id != poison
    }
    return {
        "fault": fault.name,
        "measures_exit": fault.long_task,
        "enqueued": len(ids),
        "not_run": len(ids) - done,
        "run_twice": sum(1 for n in runs.values() if n > 1),
        "poison_kills": started.get(poison, 0) if poison else None,
        "failed": failed,
        "all_ran_after_s": None if all_ran_s is None else round(all_ran_s, 2),
        "pool_exited_after_s": None if exited_s is None else round(exited_s, 2),
        "respawns": drain.log.read_text().count("respawning it"),
    }


def run(tasks: int = DEFAULT_TASKS, repeats: int = 1, only: str | None = None) -> dict[str, Any]:
    """Run every fault (or those whose name contains `only`) `repeats` times, print the table, write results/faults.json."""
    setup_django()
    chosen = [fault for fault in FAULTS if only is None or only in fault.name]
    if not chosen:
        raise SystemExit(f"No fault row's name contains {only!r}; the rows are: {'; '.join(f.name for f in FAULTS)}.")
    rows: dict[str, list[dict[str, Any]]] = {fault.name: [] for fault in chosen}
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-faults-"))
    with valkey() as counter_server:
        for repeat in range(repeats):
            for fault in chosen:
                row = measure_once(fault, counter_server.url, tasks, scratch)
                rows[fault.name].append(row)
                print(f"[{repeat + 1}/{repeats}] {fault.name}: {row}", flush=True)
        version = server_version(redis.Redis.from_url(counter_server.url))
    shutil.rmtree(scratch, ignore_errors=True)
    figures = {
        "server": version,
        "repeats": repeats,
        "tasks": tasks,
        "task_ms": TASK_MS,
        "fault_after_s": FAULT_AFTER_S,
        "observe_s": OBSERVE_S,
        "worker": " ".join(WORKER),
        "rows": rows,
    }
    print_faults(figures)
    print(f"\nwrote {report.write_results('faults', figures)}")
    return figures


def _worst(values: list[Any]) -> Any:
    """The worst of repeated readings: a missing one (never reached) is worse than any number."""
    return None if None in values else max(values)


def print_faults(figures: dict[str, Any]) -> None:
    """Print the issue's table in markdown, the worst reading of each column over the repeats."""
    print(
        f"\n{figures['tasks']:,} tasks of {figures['task_ms']} ms, `{figures['worker']}`, default settings, "
        f"fault {figures['fault_after_s']:g} s into the drain, watched {figures['observe_s']:g} s "
        f"(worst of {figures['repeats']}, {figures['server']})\n"
    )
    print("| fault | enqueued | not run after 60 s | run twice | marked FAILED | all ran after | pool exited after |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in figures["rows"].items():
        sigterm = runs[0]["measures_exit"]
        ran = _worst([r["all_ran_after_s"] for r in runs])
        exited = _worst([r["pool_exited_after_s"] for r in runs])
        respawns = max(r["respawns"] for r in runs)
        not_run = "-" if sigterm else f"{max(r['not_run'] for r in runs):,}"
        if respawns and not sigterm:
            not_run += f" (worker respawned {respawns} time{'s' if respawns > 1 else ''})"
        failed = _worst([r["failed"] for r in runs])
        kills = [r.get("poison_kills") for r in runs if r.get("poison_kills") is not None]
        print(
            f"| {name} | {runs[0]['enqueued']:,} | {not_run} | {max(r['run_twice'] for r in runs)} "
            f"| {'?' if failed is None else failed}{f' (the poison, after {max(kills)} kills)' if kills else ''} "
            f"| {'-' if sigterm else 'not within 60 s' if ran is None else f'{ran:.1f} s'} "
            f"| {('still running 60 s later' if exited is None else f'{exited:.1f} s') if sigterm else '-'} |"
        )
