"""Paired A/B of the default drain and single enqueue: an older commit against this work tree, in one run.

`python -m tests.benchmarks.ab REV [--repeats N] [--tasks N]` checks REV out into a temporary
`git worktree`, then alternates the two trees (A B, B A, ...) on a fresh Valkey each run: the
tree's own code enqueues `--tasks` echo tasks with `enqueue_many`, its own `threadmill worker
--exit-empty -w 1 -t 1` drains them (tasks/s from the first finished task to the last, read by a
ZCARD poll every 5 ms; the server's CPU per task over the whole run, the worker process tree's over that
window, read with psutil as the drain benchmark does), then 10,000 single
`enqueue` calls from one thread are timed (the median rate of five chunks of 2,000, the
producer's CPU per call and the server's, which a loaded machine moves less than the rate). Both trees run under `tests.settings` with this
venv's packages. Paired ratios (B over A, each repeat's) are the figures to quote; the machine
is shared, so a ratio of medians is not. Results go to results/ab.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis

from tests.benchmarks import report
from tests.benchmarks.drain import tree_cpu_s
from tests.benchmarks.server import valkey

ROOT = Path(__file__).resolve().parents[2]
#: Seconds between two polls of the successful segment while a drain runs.
POLL_S = 0.005
#: Single enqueues timed per run.
ENQUEUES = 10_000

_PRODUCER = r"""
import json, sys, time
import django; django.setup()
from tests.tasks import echo
if sys.argv[1] == "fill":
    echo.enqueue_many([((i,), {}) for i in range(int(sys.argv[2]))])
else:
    for i in range(200):
        echo.enqueue(i)
    count, chunks = int(sys.argv[2]), 5
    rates, cpu = [], time.process_time()
    for chunk in range(chunks):
        started = time.perf_counter()
        for i in range(count // chunks):
            echo.enqueue(i)
        rates.append(count // chunks / (time.perf_counter() - started))
    cpu = time.process_time() - cpu
    # The median chunk's rate: a burst of the shared machine's other work moves one chunk, not the figure.
    rate = sorted(rates)[chunks // 2]
    print(json.dumps({"enqueue_per_s": rate, "enqueue_client_cpu_us": cpu / count * 1e6}))
"""


def server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_sys"] + info["used_cpu_user"]


def cpu_s(processes: list[psutil.Process]) -> dict[int, float]:
    """Return the CPU seconds of each of `processes` still alive, by pid."""
    cpu = {}
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            cpu[process.pid] = times.user + times.system
    return cpu


def one_run(tree: Path, tasks: int) -> dict[str, float]:
    """Drain `tasks` echo tasks and time single enqueues with `tree`'s code, on a Valkey of its own."""
    with valkey() as server:
        client = redis.Redis.from_url(server.url)
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "THREADMILL_TEST_REDIS_URL": server.url}
        producer = [sys.executable, "-c", _PRODUCER]
        subprocess.run([*producer, "fill", str(tasks)], cwd=tree, env=env, check=True)
        cpu_before, started = server_cpu_s(client), time.perf_counter()
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "threadmill", "worker", "--exit-empty", "-w", "1", "-t", "1", "-q", "default"],
            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        first = first_count = None
        first_cpu: dict[int, float] = {}
        last_cpu: dict[int, float] = {}
        while (done := client.zcard("threadmill:{default}:default:successful")) < tasks and worker.poll() is None:
            if first is None and done:
                first, first_count, first_cpu = time.perf_counter(), done, tree_cpu_s(worker.pid)
                processes = [psutil.Process(pid) for pid in first_cpu]
            elif first is not None:
                # Read at every poll: the worker process may have exited by the time the last result is seen.
                last_cpu.update(cpu_s(processes))
            time.sleep(POLL_S)  # a sampling interval, not a synchronisation
        last = time.perf_counter()
        last_cpu.update(cpu_s(processes) if first is not None else {})
        worker.wait(60)
        if first is None or done < tasks:
            raise RuntimeError(f"{tree}: the drain finished {done} of {tasks} tasks")
        drain = {
            "drain_tasks_per_s": (tasks - first_count) / (last - first),
            "start_to_first_result_s": first - started,
            "server_cpu_us_per_task": (server_cpu_s(client) - cpu_before) / tasks * 1e6,
            # The pool and its worker process, from the first result to the last poll that found them alive.
            "worker_cpu_us_per_task": sum(last_cpu[pid] - first_cpu[pid] for pid in last_cpu.keys() & first_cpu.keys())
            / (tasks - first_count)
            * 1e6,
        }
        cpu_before = server_cpu_s(client)
        enqueue = subprocess.run(
            [*producer, "enqueue", str(ENQUEUES)], cwd=tree, env=env, check=True, capture_output=True, text=True
        )
        # Over the producer's whole run, its start and warm-up included: a few ms against 10,000 calls.
        server_us = (server_cpu_s(client) - cpu_before) / ENQUEUES * 1e6
        return drain | json.loads(enqueue.stdout.strip().splitlines()[-1]) | {"enqueue_server_cpu_us": server_us}


def paired(runs: list[dict[str, Any]], figure: str) -> list[float]:
    """Each repeat's B over A for `figure`."""
    by_repeat: dict[int, dict[str, float]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["tree"]] = run[figure]
    return [pair["B"] / pair["A"] for pair in by_repeat.values() if len(pair) == 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare this work tree against (A)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=40_000)
    options = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-ab-"))
    old = scratch / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), options.rev], cwd=ROOT, check=True)
    try:
        runs = []
        for repeat in range(options.repeats):
            for name in ("A", "B") if repeat % 2 == 0 else ("B", "A"):
                load = os.getloadavg()[0]  # the machine's load as the run starts: a shared machine's noise
                run = one_run(old if name == "A" else ROOT, options.tasks)
                runs.append({"tree": name, "repeat": repeat, "load_1m": load, **run})
                print(json.dumps(runs[-1]), flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    figures = (
        "drain_tasks_per_s", "worker_cpu_us_per_task", "server_cpu_us_per_task", "enqueue_per_s",
        "enqueue_client_cpu_us", "enqueue_server_cpu_us", "start_to_first_result_s",
    )  # fmt: skip
    ratios = {figure: paired(runs, figure) for figure in figures}
    summary = {figure: {"median_ratio": report.median(values), "ratios": values} for figure, values in ratios.items()}
    rows = [
        [figure, f"{s['median_ratio']:.2f}", ", ".join(f"{r:.2f}" for r in s["ratios"])]
        for figure, s in summary.items()
    ]
    report.print_table(f"B (this tree) over A ({options.rev}), paired", ["figure", "median", "each repeat"], rows)
    a = {"rev": options.rev, "tasks": options.tasks, "repeats": options.repeats, "runs": runs, "paired": summary}
    print(f"\nwrote {report.write_results('ab', a)}")


if __name__ == "__main__":
    main()
