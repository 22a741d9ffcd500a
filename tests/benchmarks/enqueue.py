"""Enqueue benchmark: tasks per second one process enqueues, one at a time and in bulk.

Each measurement runs in its own process (`python -m tests.benchmarks.enqueue measure
SYSTEM MODE TASKS BATCH`), so every queue gets its own settings module and broker client;
it enqueues a warm-up, then times `TASKS` echo tasks and reports the wall time, its own
CPU and the server's CPU over exactly that loop. Repeats are interleaved and the
median is reported, with each row's ratio to threadmill's single enqueue of the same repeat.
The `unique` rows enqueue a `@task(unique=True)` task, each call with its own arguments (every
one stored): the cost of the uniqueness check and key on top of a plain enqueue.

`python -m tests.benchmarks.enqueue SYSTEM DEPTH` fills a queue for the drain benchmark.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
import redis

from . import report
from .server import server_version, valkey

#: Tasks enqueued before the timed loop (connections, script loading, imports).
WARM_UP_TASKS = 200
#: Tasks per bulk enqueue call.
DEFAULT_BATCH = 100
#: Peers measured beside threadmill unless told otherwise.
DEFAULT_PEERS = ["dramatiq", "celery"]


def setup_django() -> None:
    import django

    django.setup()


def enqueue(system: str, depth: int) -> None:
    """Fill the queue of `system` with `depth` echo tasks, one enqueue call each."""
    if system in ("threadmill", "django-tasks-db", "django-tasks-rq"):
        setup_django()
    if system == "threadmill":
        from tests.tasks import echo

        task = echo
        if os.environ.get("THREADMILL_BENCH_TASK_LIMIT"):
            # The drain's per-task limit rows: echo with `@task(concurrency=...)` or `rate=...` (JSON).
            task = dataclasses.replace(echo, **json.loads(os.environ["THREADMILL_BENCH_TASK_LIMIT"]))
        for i in range(depth):
            task.enqueue(i)
    elif system == "dramatiq":
        from .peers import dramatiq_app

        dramatiq_app.enqueue(depth)
    elif system == "celery":
        from .peers import celery_app

        celery_app.enqueue(depth)
    else:
        from .peers import echo_tasks

        echo_tasks.enqueue(depth)


# -- one timed measurement, in its own process ---------------------------------------------

#: How each row enqueues `count` tasks starting at `start`: system, then mode.
Enqueuer = Callable[[int, int], None]


def threadmill_enqueuer(mode: str, batch: int) -> Enqueuer:
    setup_django()
    from tests.tasks import echo, unique_echo

    if mode.startswith("unique-"):
        echo, mode = unique_echo, mode.removeprefix("unique-")
    if mode == "single":

        def single(start: int, count: int) -> None:
            for i in range(start, start + count):
                echo.enqueue(i)

        return single
    if mode == "bulk":

        def bulk(start: int, count: int) -> None:
            for offset in range(start, start + count, batch):
                size = min(batch, start + count - offset)
                echo.enqueue_many([((i,), {}) for i in range(offset, offset + size)])

        return bulk
    if mode == "aenqueue":

        def sequential_awaits(start: int, count: int) -> None:
            async def enqueue_all() -> None:
                for i in range(start, start + count):
                    await echo.aenqueue(i)

            asyncio.run(enqueue_all())

        return sequential_awaits
    raise ValueError(f"Unknown threadmill mode {mode!r}.")


def peer_enqueuer(system: str) -> Enqueuer:
    if system == "dramatiq":
        from .peers.dramatiq_app import echo

        send = echo.send
    elif system == "celery":
        from .peers.celery_app import echo

        send = echo.delay
    elif system == "huey":
        from .peers.huey_app import echo

        send = echo
    elif system == "rq":
        from .peers.rq_app import echo, queue

        rq_queue = queue()

        def send(i: int) -> None:
            rq_queue.enqueue(echo, i)
    else:
        raise ValueError(f"Unknown system {system!r}.")

    def single(start: int, count: int) -> None:
        for i in range(start, start + count):
            send(i)

    return single


def measure(system: str, mode: str, tasks: int, batch: int) -> dict[str, float]:
    """Time `tasks` enqueues of `system` in `mode` after a warm-up; return wall, client and server CPU."""
    enqueuer = threadmill_enqueuer(mode, batch) if system == "threadmill" else peer_enqueuer(system)
    server = psutil.Process(int(os.environ["BENCH_SERVER_PID"]))
    enqueuer(0, WARM_UP_TASKS)
    server_before, cpu_before = sum(server.cpu_times()[:2]), time.process_time()
    started = time.perf_counter()
    enqueuer(WARM_UP_TASKS, tasks)
    seconds = time.perf_counter() - started
    client_cpu, server_cpu = time.process_time() - cpu_before, sum(server.cpu_times()[:2]) - server_before
    return {
        "tasks_per_s": tasks / seconds,
        "client_cpu_us_per_task": client_cpu / tasks * 1e6,
        "server_cpu_us_per_task": server_cpu / tasks * 1e6,
        "seconds": seconds,
    }


# -- the run ------------------------------------------------------------------------------


def rows(peer_names: list[str]) -> list[tuple[str, str, str]]:
    """Return (row name, system, mode) for every row of the table."""
    from threadmill.backends.redis import RedisTaskBackend

    chosen = [("threadmill enqueue", "threadmill", "single")]
    if hasattr(RedisTaskBackend, "enqueue_many"):
        # Through the task-level helper users call, which hands the batch to backend.enqueue_many.
        chosen.append(("threadmill enqueue_many", "threadmill", "bulk"))
    else:
        print("threadmill enqueue_many skipped: RedisTaskBackend has no enqueue_many yet.", flush=True)
    chosen.append(("threadmill aenqueue", "threadmill", "aenqueue"))
    chosen.append(("threadmill enqueue unique", "threadmill", "unique-single"))
    chosen.append(("threadmill enqueue_many unique", "threadmill", "unique-bulk"))
    return chosen + [(f"{name} single", name, "single") for name in peer_names]


def measure_in_process(server, system: str, mode: str, tasks: int, batch: int) -> dict[str, float]:
    """Run one measurement in a fresh process against `server`, and return its figures."""
    from .drain import ROOT

    base = server.url.rsplit("/", 1)[0]
    env = {**os.environ, "BENCH_REDIS_URL": server.url, "THREADMILL_TEST_REDIS_URL": server.url}
    env.update({"BENCH_SERVER_PID": str(server.process.pid), "DJANGO_SETTINGS_MODULE": "tests.settings"})
    command = [sys.executable, "-m", "tests.benchmarks.enqueue", "measure", system, mode, str(tasks), str(batch)]
    timeout = tasks / 50 + 120
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"Enqueue of {system} ({mode}) on {base} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(
    tasks: int = 20_000, repeats: int = 3, batch: int = DEFAULT_BATCH, peer_names: list[str] | None = None
) -> dict[str, Any]:
    """Measure every row `repeats` times, interleaved, and print and write the medians."""
    table = rows(DEFAULT_PEERS if peer_names is None else peer_names)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in table}
    with valkey() as server:
        client = redis.Redis.from_url(server.url)
        for repeat in range(repeats):
            for name, system, mode in table:
                client.flushall()
                figures = measure_in_process(server, system, mode, tasks, batch)
                runs[name].append(figures)
                print(f"[{repeat + 1}/{repeats}] {name}: {figures['tasks_per_s']:,.0f} tasks/s", flush=True)
        version = server_version(client)
        client.flushall()
    results = {}
    base = runs["threadmill enqueue"]
    for name, system, mode in table:
        entry: dict[str, Any] = {"system": system, "mode": mode, "batch": batch if mode.endswith("bulk") else 1}
        for key in runs[name][0]:
            entry[key] = round(report.median([r[key] for r in runs[name]]), 3)
        pairs = zip(runs[name], base, strict=True)
        entry["paired_tasks_per_s_ratio"] = round(
            report.median([r["tasks_per_s"] / b["tasks_per_s"] for r, b in pairs]), 3
        )
        if mode.startswith("unique-"):
            plain = runs[name.removesuffix(" unique")]
            entry["paired_tasks_per_s_ratio_vs_not_unique"] = round(
                report.median([r["tasks_per_s"] / p["tasks_per_s"] for r, p in zip(runs[name], plain, strict=True)]), 3
            )
        entry["runs"] = runs[name]
        results[name] = entry
    figures = {"server": version, "tasks": tasks, "repeats": repeats, "batch": batch, "rows": results}
    print_enqueue(figures)
    print(f"\nwrote {report.write_results('enqueue', figures)}")
    return figures


def print_enqueue(figures: dict[str, Any]) -> None:
    rows_ = []
    for name, entry in figures["rows"].items():
        rates = [r["tasks_per_s"] for r in entry["runs"]]
        rate = f"{min(rates):,.0f}..{max(rates):,.0f}"
        vs_plain = entry.get("paired_tasks_per_s_ratio_vs_not_unique")
        rows_.append([
            name, entry["batch"], f"{entry['tasks_per_s']:,.0f}", rate, f"{entry['client_cpu_us_per_task']:.0f}",
            f"{entry['server_cpu_us_per_task']:.0f}", f"{entry['paired_tasks_per_s_ratio']:.2f}x",
            "" if vs_plain is None else f"{vs_plain:.2f}x",
        ])  # fmt: skip
    report.print_table(
        f"enqueue from one process, echo task, {figures['tasks']:,} tasks ({figures['server']}, "
        f"median of {figures['repeats']})",
        ["row", "per call", "tasks/s", "runs tasks/s", "client us CPU/task", "server us CPU/task",
         "tasks/s vs threadmill enqueue (paired)", "unique vs not (paired)"],
        rows_,
    )  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        system, mode, count, size = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(measure(system, mode, count, size)))
    else:
        enqueue(sys.argv[1], int(sys.argv[2]))
