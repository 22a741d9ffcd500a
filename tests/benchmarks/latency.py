"""Latency benchmarks: how soon an idle worker starts a single task, and a deferred one.

`idle`: one worker process with one thread, each queue at its defaults, gets single probe
tasks with seeded random idle gaps between them; the delay runs from just before the
enqueue call to the task's first statement. Beside it, the idle pool's cost to the server:
commands per second (an `INFO commandstats` delta) and server CPU while a pool of worker
processes waits with nothing to do.

`deferred`: the same worker gets probe tasks due 1 to 3 s after their enqueue; the figure
is how late each one started after it was due.

Every queue runs on the same Valkey, one after the other, each on its own database, and
only its own worker runs while it is measured.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from . import probe, report
from .drain import ROOT, Context, stop
from .peers import RQ_WORKER_DB
from .server import server_version, valkey

#: Peers measured beside threadmill unless told otherwise.
DEFAULT_PEERS = ["celery", "dramatiq", "huey", "rq"]
#: Probe tasks per queue (the issue's method).
DEFAULT_SAMPLES = 30
#: Seed of the idle gaps and deferred leads, so every queue gets the same sequence.
DEFAULT_SEED = 9
#: Worker processes of the idle pool whose cost at rest is measured.
DEFAULT_POOL_WORKERS = 10
#: Seconds over which the idle pool's commands are counted.
AT_REST_WINDOW_S = 10.0
#: Seconds the server's client count must hold still before a pool counts as started.
SETTLED_S = 3.0
#: Seconds a pool may take to start.
POOL_START_TIMEOUT_S = 120.0
#: Commands the harness sends during an at-rest window: the reset that opens it and the read that closes it.
AT_REST_HARNESS_COMMANDS = frozenset({"config|resetstat", "info"})


@dataclass(frozen=True)
class System:
    """A queue under test: how to run one idle worker, and how to run an idle pool of them."""

    name: str
    worker: list[str]
    pool: list[str]
    pool_copies: int = 1
    #: Server connections that show the idle pool is up (None: one per worker process).
    pool_min_clients: int | None = None
    settings: str | None = None
    #: Extra worker arguments the deferred benchmark needs (rq schedules only with --with-scheduler).
    deferred_extra: tuple[str, ...] = ()
    note: str = ""


def systems(server_url: str, pool_workers: int) -> dict[str, System]:
    """Return every queue the latency benchmarks know, keyed by name."""
    rq_url = f"{server_url.rsplit('/', 1)[0]}/{RQ_WORKER_DB}"
    celery = ["-m", "celery", "-A", "tests.benchmarks.peers.celery_app", "worker", "-Q", "default", "-l", "WARNING"]
    dramatiq = ["-m", "dramatiq", "tests.benchmarks.peers.dramatiq_app", "-t", "1", "-Q", "default", "-p"]
    huey = ["-m", "huey.bin.huey_consumer", "tests.benchmarks.peers.huey_app.huey", "-w"]
    rq = ["-m", "rq.cli", "worker", "--url", rq_url, "default"]
    threadmill = ["manage.py", "threadmill", "worker", "-t", "1", "-q", "default", "-w"]
    return {
        "threadmill": System(
            name="threadmill",
            worker=[*threadmill, "1"],
            pool=[*threadmill, str(pool_workers)],
            settings="tests.benchmarks.settings",
            note="backend OPTIONS at their defaults",
        ),
        "celery": System(
            name="celery",
            worker=[*celery, "-P", "solo"],
            pool=[*celery, "-c", str(pool_workers)],
            # Only the main process talks to the broker; its prefork children wait on pipes.
            pool_min_clients=1,
            note="solo pool for one process; the pool is its default prefork",
        ),
        "dramatiq": System(name="dramatiq", worker=[*dramatiq, "1"], pool=[*dramatiq, str(pool_workers)]),
        "huey": System(
            name="huey", worker=[*huey, "1", "-k", "thread"], pool=[*huey, str(pool_workers), "-k", "process"]
        ),
        "rq": System(
            name="rq",
            worker=rq,
            pool=rq,
            pool_copies=pool_workers,
            deferred_extra=("--with-scheduler",),
            note="a forked work horse per task; the pool is separate `rq worker` processes",
        ),
    }


@contextlib.contextmanager
def running(ctx: Context, system: System, argv: list[str], copies: int, log_name: str) -> Iterator[None]:
    """Run `copies` of a worker command in their own sessions, and stop every one of them afterwards."""
    env = ctx.env(system.settings, {})
    processes: list[subprocess.Popen] = []
    with open(ctx.scratch / log_name, "w") as log:
        try:
            for _ in range(copies):
                process = subprocess.Popen(
                    [sys.executable, *argv], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
                processes.append(process)
            yield
        finally:
            for process in processes:
                stop(process, timeout=15)


def probe_run(ctx: Context, system: System, mode: str, samples: int, seed: int) -> dict[str, Any]:
    """Run the probe driver against `system`'s worker and return its samples and summary."""
    argv = [*system.worker, *(system.deferred_extra if mode == "deferred" else ())]
    with running(ctx, system, argv, 1, f"{system.name}-{mode}.log"):
        command = [sys.executable, "-m", "tests.benchmarks.probe", system.name, mode, str(samples), str(seed)]
        timeout = probe.WARM_UP_TIMEOUT_S + samples * (probe.TIMEOUT_S + 5)
        done = subprocess.run(
            command,
            check=False,
            cwd=ROOT,
            env=ctx.env(system.settings, {}),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if done.returncode != 0:
        raise RuntimeError(f"The {mode} probe of {system.name} failed: {done.stderr.strip()[-2000:]}")
    measured = json.loads(done.stdout)["samples"]
    late = [s["late_ms"] for s in measured]
    return {
        "worker": " ".join(argv),
        "note": system.note,
        **probe.summary(late),
        "enqueue_p50_ms": round(probe.percentile([s["enqueue_ms"] for s in measured], 0.5), 3),
        "samples": measured,
    }


def connected_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["connected_clients"])


def wait_until_settled(client: redis.Redis, minimum: int, timeout: float) -> int:
    """Wait until at least `minimum` clients are connected and their count held still for SETTLED_S; return it."""
    deadline = time.monotonic() + timeout
    count, since = connected_clients(client), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now_count = connected_clients(client)
        if now_count != count:
            count, since = now_count, time.monotonic()
        elif count > minimum and time.monotonic() - since >= SETTLED_S:
            return count
    raise RuntimeError(f"The idle pool did not settle within {timeout:.0f} s.")


def server_cpu_ms(client: redis.Redis) -> float:
    """Return the server's own CPU time (INFO cpu, microsecond resolution) in milliseconds."""
    cpu = client.info("cpu")
    return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e3


def count_at_rest(ctx: Context) -> dict[str, Any]:
    """Count the server's commands and CPU over AT_REST_WINDOW_S, leaving out the harness's own."""
    cpu_before = server_cpu_ms(ctx.client)
    ctx.client.config_resetstat()
    started = time.monotonic()
    time.sleep(AT_REST_WINDOW_S)
    stats = ctx.client.info("commandstats")
    seconds = time.monotonic() - started
    cpu = server_cpu_ms(ctx.client) - cpu_before
    by_command = {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in stats.items()
        if key.removeprefix("cmdstat_") not in AT_REST_HARNESS_COMMANDS
    }
    return {
        "window_s": round(seconds, 2),
        "commands_per_s": round(sum(by_command.values()) / seconds, 2),
        "server_cpu_ms_per_s": round(cpu / seconds, 3),
        "commands_per_s_by_command": {name: round(calls / seconds, 2) for name, calls in sorted(by_command.items())},
    }


def at_rest(ctx: Context, system: System, pool_workers: int) -> dict[str, Any]:
    """Start an idle pool of `system` and count what it costs the server while it waits."""
    copies = system.pool_copies
    with running(ctx, system, system.pool, copies, f"{system.name}-pool.log"):
        minimum = pool_workers if system.pool_min_clients is None else system.pool_min_clients
        clients = wait_until_settled(ctx.client, minimum, POOL_START_TIMEOUT_S)
        counted = count_at_rest(ctx)
    return {
        "pool": " ".join(system.pool) + (f" (x{copies})" if copies > 1 else ""),
        "worker_processes": pool_workers,
        "connected_clients": clients,
        **counted,
    }


def selected(names: list[str], known: dict[str, System]) -> list[System]:
    return [known["threadmill"], *(known[name] for name in names if name in known)]


def run_idle(
    peer_names: list[str] | None = None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = DEFAULT_SEED,
    pool_workers: int = DEFAULT_POOL_WORKERS,
) -> dict[str, Any]:
    """Probe every queue's idle latency, measure its idle pool at rest, and print and write the figures."""
    with session() as ctx:
        chosen = selected(DEFAULT_PEERS if peer_names is None else peer_names, systems(ctx.server.url, pool_workers))
        latency, pools = {}, {}
        # The server's own cost with no worker at all (its timers), which every pool's figure includes.
        baseline = count_at_rest(ctx) if pool_workers else {}
        for system in chosen:
            ctx.client.flushall()
            latency[system.name] = probe_run(ctx, system, "idle", samples, seed)
            print(f"idle {system.name}: p50 {latency[system.name]['p50_ms']:.1f} ms", flush=True)
            if pool_workers:
                ctx.client.flushall()
                pools[system.name] = at_rest(ctx, system, pool_workers)
                print(f"idle pool {system.name}: {pools[system.name]['commands_per_s']:.1f} commands/s", flush=True)
        version = server_version(ctx.client)
    figures = {
        "server": version, "samples": samples, "seed": seed, "queues": latency, "idle_pool": pools,
        "server_alone": baseline,
    }  # fmt: skip
    print_idle(figures)
    print(f"\nwrote {report.write_results('idle', figures)}")
    return figures


def run_deferred(
    peer_names: list[str] | None = None, samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED
) -> dict[str, Any]:
    """Probe how late every queue starts a deferred task, and print and write the figures."""
    with session() as ctx:
        chosen = selected(DEFAULT_PEERS if peer_names is None else peer_names, systems(ctx.server.url, 1))
        lateness = {}
        for system in chosen:
            ctx.client.flushall()
            lateness[system.name] = probe_run(ctx, system, "deferred", samples, seed)
            print(f"deferred {system.name}: p90 {lateness[system.name]['p90_ms']:.1f} ms late", flush=True)
        version = server_version(ctx.client)
    figures = {"server": version, "samples": samples, "seed": seed, "queues": lateness}
    print_deferred(figures)
    print(f"\nwrote {report.write_results('deferred', figures)}")
    return figures


@contextlib.contextmanager
def session() -> Iterator[Context]:
    """Start the benchmark's Valkey and a scratch directory for the workers' logs; remove both afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-latency-"))
    try:
        with valkey() as server:
            yield Context(server, scratch)
    except BaseException:
        print(f"worker logs kept in {scratch}", file=sys.stderr)
        raise
    shutil.rmtree(scratch, ignore_errors=True)


def ratio(value: float, base: float) -> str:
    """Return `value / base` as a multiplier with two significant figures, written out in full."""
    if not base:
        return "-"
    times = value / base
    return f"{times:,.0f}x" if abs(times) >= 10 else f"{times:.2f}x" if abs(times) >= 0.1 else f"{times:.3f}x"


def print_idle(figures: dict[str, Any]) -> None:
    queues, pools = figures["queues"], figures["idle_pool"]
    base = queues.get("threadmill", {}).get("p50_ms", 0)
    rows = []
    for name, entry in queues.items():
        pool = pools.get(name, {})
        rows.append([
            name, f"{entry['p50_ms']:.1f}", f"{entry['p90_ms']:.1f}", f"{entry['max_ms']:.1f}",
            f"{entry['enqueue_p50_ms']:.2f}", ratio(entry["p50_ms"], base),
            f"{pool['commands_per_s']:.1f}" if pool else "-", f"{pool['server_cpu_ms_per_s']:.2f}" if pool else "-",
        ])  # fmt: skip
    workers = next(iter(pools.values()), {}).get("worker_processes", "-")
    report.print_table(
        f"idle latency, 1 process x 1 thread, {figures['samples']} single tasks after 0.3-2 s idle gaps, "
        f"enqueue to first line ({figures['server']})",
        ["queue", "p50 ms", "p90 ms", "max ms", "enqueue call p50 ms", "p50 vs threadmill",
         f"idle pool of {workers}: cmds/s", "server CPU ms/s"],
        rows,
    )  # fmt: skip
    alone = figures.get("server_alone")
    if alone:
        print(
            f"  with no worker at all the server ran {alone['commands_per_s']:.1f} commands/s "
            f"and {alone['server_cpu_ms_per_s']:.2f} ms CPU/s; commands run inside scripts count too"
        )
    for name, pool in pools.items():
        detail = ", ".join(f"{command} {rate:g}" for command, rate in pool["commands_per_s_by_command"].items())
        print(f"  idle pool of {name}, commands/s: {detail or 'none'}")


def print_deferred(figures: dict[str, Any]) -> None:
    queues = figures["queues"]
    base = queues.get("threadmill", {}).get("p90_ms", 0)
    rows = [
        [name, f"{e['p50_ms']:.1f}", f"{e['p90_ms']:.1f}", f"{e['max_ms']:.1f}", ratio(e["p90_ms"], base)]
        for name, e in queues.items()
    ]
    report.print_table(
        f"deferred start, 1 process x 1 thread, {figures['samples']} tasks due 1-3 s after enqueue, "
        f"lateness after run_after ({figures['server']})",
        ["queue", "p50 ms late", "p90 ms late", "max ms late", "p90 vs threadmill"],
        rows,
    )
