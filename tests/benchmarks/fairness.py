"""Fairness benchmark: a pool of two single-thread processes given fast and slow tasks, then a priority task.

Each row fills its queue with 400 tasks of 1 ms and 40 of 250 ms, ten fast then one slow,
repeated (tests/benchmarks/naps.py, every task sleeping for its duration), starts a pool of
two processes with one thread each, and one second after the first task started enqueues
one task of 1 ms at the highest priority the queue has. Every task records its start and
finish; the makespan runs from the first start to the last finish, against the ideal of
the total work over two processes (5.2 s), and the priority task's delay runs from just
before its enqueue call to its start. A buffer that holds slow tasks in one process while
the other has nothing left stretches the makespan; a buffer in lease order keeps the
priority task waiting behind what it holds.

Every queue runs on the same Valkey, one after the other, repeats interleaved, and the
median of the repeats is reported.
"""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from . import naps, report
from .drain import ROOT, Context, stop, worker_rejects
from .peers import FAIRNESS_DB
from .server import server_version, valkey

#: Seconds a row may take from its worker's start to its last task's finish.
ROW_TIMEOUT_S = 120.0
#: Seconds the filler may take to fill a queue.
FILL_TIMEOUT_S = 60.0
#: Seconds between two reads of the runs hash.
POLL_S = 0.05
DEFAULT_PEERS = ["celery", "dramatiq"]
#: The pool's shape in every row: two processes, one thread each.
PROCESSES = 2
THREADS = 1


@dataclass(frozen=True)
class Row:
    """One row of the table: the queue's system and the worker command that runs its pool."""

    name: str
    system: str
    worker: list[str]
    settings: str | None = None
    #: Threadmill's arguments this checkout's worker must accept before the row runs.
    threadmill_arguments: list[str] = field(default_factory=list)
    note: str = ""


def threadmill_row(count: str, note: str) -> Row:
    arguments = ["--prefetch-count", count]
    shape = ["-w", str(PROCESSES), "-t", str(THREADS)]
    return Row(
        name=f"threadmill --prefetch-count {count}",
        system="threadmill",
        worker=["manage.py", "threadmill", "worker", *shape, "-q", "default", *arguments],
        settings="tests.benchmarks.settings",
        threadmill_arguments=arguments,
        note=note,
    )


def peer_rows(names: list[str]) -> list[Row]:
    celery = (
        f"-m celery -A tests.benchmarks.peers.celery_app worker -c {PROCESSES} -Q default"
        " --without-gossip --without-mingle --without-heartbeat -l WARNING"
    ).split()
    rows = {
        "celery": [
            Row("celery", "celery", celery, note="prefork pool, prefetch multiplier 4 (its defaults)"),
            Row("celery -O fair", "celery", [*celery, "-O", "fair"], note="prefork pool, prefetch multiplier 4"),
            Row(
                "celery -O fair --prefetch-multiplier 1", "celery",
                [*celery, "-O", "fair", "--prefetch-multiplier", "1"], note="the production guides' setting",
            ),
        ],
        "dramatiq": [
            Row(
                "dramatiq", "dramatiq",
                ["-m", "dramatiq", "tests.benchmarks.peers.dramatiq_app", "-p", str(PROCESSES), "-t", str(THREADS),
                 "-Q", "default"],
                note="prefetch 2 per process (its default, 2 x threads)",
            ),
        ],
    }  # fmt: skip
    unknown = set(names) - rows.keys()
    if unknown:
        raise ValueError(f"Unknown peers: {', '.join(sorted(unknown))}; choose from {', '.join(rows)}.")
    return [row for name in names for row in rows[name]]


def rows_under_test(peer_names: list[str]) -> list[Row]:
    return [
        threadmill_row("auto", "buffer sized by time"),
        threadmill_row("4", "fixed, 4 per thread (today's default)"),
        threadmill_row("1", "fixed, one task at a time"),
        *peer_rows(peer_names),
    ]


# -- one row ------------------------------------------------------------------------------


def read_line(process: subprocess.Popen, timeout: float, what: str) -> str:
    """Return the next line the filler prints, or raise if it exits or takes longer than `timeout`."""
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    line = process.stdout.readline() if ready else ""
    if not line:
        raise RuntimeError(f"The filler printed no {what} within {timeout:g} s (exit code {process.poll()}).")
    return line


def run_once(ctx: Context, row: Row, order: str) -> dict[str, Any]:
    """Fill the queue, run the pool until every task finished, and return the row's figures."""
    ctx.client.flushall()
    runs_client = ctx.db(FAIRNESS_DB)
    env = ctx.env(row.settings, {})
    expected = len(naps.workload()) + 1
    log_path = ctx.scratch / f"{row.name.replace(' ', '_')}.log"
    filler = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks.naps", row.system, "--order", order], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    with open(log_path, "w") as log:
        try:
            read_line(filler, FILL_TIMEOUT_S, "`filled`")
            worker = subprocess.Popen(
                [sys.executable, *row.worker], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                sent = json.loads(read_line(filler, naps.FIRST_START_TIMEOUT_S + 5, "priority enqueue"))
                wait_for_runs(runs_client, expected, worker, row, log_path)
            finally:
                stop(worker)
        finally:
            stop(filler)
    return figures_of(naps.runs(runs_client), sent)


def wait_for_runs(client: redis.Redis, expected: int, worker: subprocess.Popen, row: Row, log_path: Path) -> None:
    """Return once `expected` tasks recorded their run; raise if the pool exits or the row takes too long."""
    deadline = time.monotonic() + ROW_TIMEOUT_S
    while (done := client.hlen(naps.RUNS_KEY)) < expected:
        if worker.poll() is not None:
            raise RuntimeError(f"{row.name} exited with {worker.returncode} after {done} tasks; see {log_path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{row.name} finished {done} of {expected} tasks in time; see {log_path}")
        time.sleep(POLL_S)


def figures_of(runs: dict[str, tuple[float, float, int]], sent: dict[str, float]) -> dict[str, Any]:
    """Return the makespan, its ratio to the ideal, the priority task's delay and each process's share."""
    first_start = min(started for started, _, _ in runs.values())
    last_finish = max(finished for _, finished, _ in runs.values())
    ideal = naps.total_work_s() / PROCESSES
    urgent_started, _, _ = runs[naps.URGENT_TOKEN]
    last_by_process: dict[int, float] = {}
    for _, finished, pid in runs.values():
        last_by_process[pid] = max(finished, last_by_process.get(pid, 0.0))
    slow = Counter(pid for token, (_, _, pid) in runs.items() if token.startswith("slow-"))
    return {
        "makespan_s": last_finish - first_start,
        "ideal_s": ideal,
        "makespan_ratio": (last_finish - first_start) / ideal,
        "urgent_delay_ms": (urgent_started - sent["urgent_enqueued_at"]) * 1e3,
        "urgent_enqueued_after_first_start_s": sent["urgent_enqueued_at"] - first_start,
        # The gap between the processes' last finishes: how long one sat idle at the end while the other worked.
        "idle_at_end_s": max(last_by_process.values()) - min(last_by_process.values()),
        "processes": len(last_by_process),
        "slow_tasks_by_process": sorted(slow.values(), reverse=True),
    }


# -- the run ------------------------------------------------------------------------------


def run(repeats: int = 3, peer_names: list[str] | None = None, order: str = naps.ORDERS[0]) -> dict[str, Any]:
    """Run every row `repeats` times, interleaved, and print and write the medians.

    The tasks are interleaved unless `order` is `fast-first`, a diagnostic whose figures go to
    results/fairness-fast-first.json, beside the chart's and the README's fairness.json.
    """
    peer_names = DEFAULT_PEERS if peer_names is None else peer_names
    rows, skipped = [], {}
    for row in rows_under_test(peer_names):
        if row.threadmill_arguments and (reason := worker_rejects(row.threadmill_arguments, row.settings)):
            skipped[row.name] = reason
            print(f"{row.name}: not run, the worker refuses it: {reason}", flush=True)
        else:
            rows.append(row)
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-fairness-"))
    runs: dict[str, list[dict[str, Any]]] = {row.name: [] for row in rows}
    with valkey() as server:
        ctx = Context(server, scratch)
        for repeat in range(repeats):
            for row in rows:
                figures = run_once(ctx, row, order)
                runs[row.name].append(figures)
                print(
                    f"[{repeat + 1}/{repeats}] {row.name}: makespan {figures['makespan_s']:.2f} s "
                    f"({figures['makespan_ratio']:.2f}x ideal), priority task started after "
                    f"{figures['urgent_delay_ms']:,.0f} ms",
                    flush=True,
                )
        version = server_version(redis.Redis.from_url(server.url))
    shutil.rmtree(scratch, ignore_errors=True)
    results = {row.name: summarise(row, runs[row.name]) for row in rows}
    figures = {
        "server": version,
        "repeats": repeats,
        "processes": PROCESSES,
        "threads": THREADS,
        "workload": {
            "order": order,
            "fast": naps.FAST_PER_SLOW * naps.ROUNDS,
            "fast_s": naps.FAST_S,
            "slow": naps.ROUNDS,
            "slow_s": naps.SLOW_S,
            "urgent_s": naps.URGENT_S,
            "urgent_after_first_start_s": naps.URGENT_AFTER_S,
            "total_work_s": round(naps.total_work_s(), 3),
        },
        "ideal_s": round(naps.total_work_s() / PROCESSES, 4),
        "queues": results,
        "skipped": skipped,
    }
    print_fairness(figures)
    name = "fairness" if order == naps.ORDERS[0] else f"fairness-{order}"
    print(f"\nwrote {report.write_results(name, figures)}")
    return figures


def summarise(row: Row, runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = {
        key: round(report.median([r[key] for r in runs]), 4)
        for key in ("makespan_s", "makespan_ratio", "urgent_delay_ms", "idle_at_end_s")
    }
    return {"system": row.system, "worker": " ".join(row.worker), "note": row.note, **medians, "runs": runs}


def print_fairness(figures: dict[str, Any]) -> None:
    rows = []
    for name, entry in figures["queues"].items():
        makespans = [r["makespan_s"] for r in entry["runs"]]
        delays = [r["urgent_delay_ms"] for r in entry["runs"]]
        rows.append([
            name, f"{entry['makespan_s']:.2f} s", report.spread(makespans), f"{entry['makespan_ratio']:.2f}x",
            f"{entry['idle_at_end_s']:.2f} s", f"{entry['urgent_delay_ms']:,.0f} ms",
            f"{min(delays):,.0f}..{max(delays):,.0f}",
        ])  # fmt: skip
    work = figures["workload"]
    report.print_table(
        f"fairness, {figures['processes']} processes x {figures['threads']} thread, {work['fast']} tasks of "
        f"{work['fast_s'] * 1e3:g} ms and {work['slow']} of {work['slow_s'] * 1e3:g} ms {work['order']}, "
        f"ideal {figures['ideal_s']:.2f} s ({figures['server']}, median of {figures['repeats']})",
        ["queue", "makespan", "runs", "makespan / ideal", "one process idle at the end", "priority task's start delay",
         "runs"],
        rows,
    )  # fmt: skip
    for name, reason in figures["skipped"].items():
        print(f"not run: {name} ({reason})")
