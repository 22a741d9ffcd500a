"""Memory benchmark: the server's bytes per stored task, threadmill beside its peers on one Valkey.

Each row fills an empty server (`FLUSHALL SYNC`) with N echo tasks in one state, ready,
deferred (due in an hour) or finished (drained by the system's own worker, its result kept
at the system's default retention), with a small payload (one int) or a 5 KB one. The
figure is the change of `INFO memory` `used_memory` over the fill, divided by N: every byte
the server allocated for the tasks (keys, values, the main and expires dictionaries, and the
allocator's rounding of each allocation to its size class; not the allocator's free pages),
less the script cache, which FLUSHALL keeps. celery's deferred tasks are counted in the
broker's list, where they wait until a worker takes them (and holds them in its `unacked`
hash). The fill and the worker run in processes of their own and have exited (their
connections closed) before the second reading, which waits for the server's lazy frees.

The first repeat also sums `MEMORY USAGE` (SAMPLES 0) of every key by its kind (the task id
and minute numbers replaced by `<id>` and `<n>`), and lists the fields of one threadmill task
hash in each state, with what each candidate cut would save (`memory_fields`). `python -m tests.benchmarks.memory fill SYSTEM STATE PAYLOAD N` is one fill.
`--million` enqueues 1,000,000 echo tasks with `enqueue_many` and reports the server's memory.
"""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from threadmill.backends.keys import KeySchema

from . import memory_fields, report
from .drain import ROOT, Context, peer_queues, stop, threadmill_finished, threadmill_worker
from .peers import RQ_WORKER_DB
from .server import server_version, valkey

#: Systems measured unless told otherwise (celery with the Redis result backend).
DEFAULT_PEERS = ["dramatiq", "celery", "rq"]
STATES = ("ready", "deferred", "finished")
#: The payloads: the argument each echo task is enqueued with (and returns). The 5 KB one is
#: 5,120 base64 characters of seeded random bytes, so rq's zlib compression of its job data
#: gains what it would on random text (a quarter), not what it would on one repeated letter.
PAYLOADS = {"int": None, "5 KB": base64.b64encode(random.Random(5).randbytes(3840)).decode()}
#: Tasks each system enqueues once before the first row, unmeasured: its scripts load, its first keys exist.
WARM_UP_TASKS = 200
#: Tasks per row unless told otherwise.
DEFAULT_TASKS = 20_000
#: How far ahead a deferred task is due, seconds.
DEFERRED_LEAD_S = 3600
#: Tasks of the million row, and per `enqueue_many` call there.
MILLION = 1_000_000
MILLION_CALL = 10_000
#: Seconds between two reads of a drain's finished count, or of the server's pending lazy frees.
POLL_S = 0.05
#: How each system keeps a finished task's result by default (what the finished rows keep).
RETENTION = {
    "threadmill": "task hash with its result, result_ttl 86,400 s (the default)",
    "dramatiq": "Results middleware, RedisBackend, result_ttl 600,000 ms (its default)",
    "celery": "Redis result backend, result_expires 1 day (its default)",
    "rq": "job hash and rq:results stream, result_ttl 500 s (its default)",
}
SETTINGS = "tests.settings"
#: A task id (a UUID, with or without dashes, or 32 hex digits) or a number of 5 digits or more, in a key.
_ID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}|[0-9a-f]{32}")
_NUMBER = re.compile(r"(?<=[:.])\d{5,}")


# -- one fill, in its own process ---------------------------------------------------------


def fill(system: str, state: str, payload: str, tasks: int) -> None:
    """Enqueue `tasks` echo tasks of `system`, due now or (deferred) in an hour, one call each."""
    value = PAYLOADS[payload]
    lead = timedelta(seconds=DEFERRED_LEAD_S) if state == "deferred" else None
    send = sender(system, lead)
    for i in range(tasks):
        send(i if value is None else value)


def sender(system: str, lead: timedelta | None) -> Any:
    """Return a function that enqueues one echo task of `system` with its argument."""
    if system == "threadmill":
        import django

        django.setup()
        from datetime import UTC, datetime

        from tests.tasks import echo

        if lead is None:
            return echo.enqueue
        return lambda v: echo.using(run_after=datetime.now(UTC) + lead).enqueue(v)
    if system == "dramatiq":
        from .peers.dramatiq_app import echo as dramatiq_echo

        delay = None if lead is None else int(lead.total_seconds() * 1000)
        return lambda v: dramatiq_echo.send_with_options(args=(v,), delay=delay)
    if system == "celery":
        from .peers.celery_app import echo as celery_echo

        countdown = None if lead is None else lead.total_seconds()
        return lambda v: celery_echo.apply_async((v,), countdown=countdown)
    if system == "rq":
        from .peers.rq_app import echo as rq_echo
        from .peers.rq_app import queue

        rq_queue = queue()
        if lead is None:
            return lambda v: rq_queue.enqueue(rq_echo, v)
        return lambda v: rq_queue.enqueue_in(lead, rq_echo, v)
    raise ValueError(f"Unknown system {system!r}.")


def fill_million() -> float:
    """Enqueue `MILLION` threadmill echo tasks with `enqueue_many`; return the seconds it took."""
    import django

    django.setup()
    from tests.tasks import echo

    started = time.perf_counter()
    for offset in range(0, MILLION, MILLION_CALL):
        echo.enqueue_many([((i,), {}) for i in range(offset, offset + MILLION_CALL)])
    return time.perf_counter() - started


def lease() -> str:
    """Lease one ready echo task as a worker would, and return its id."""
    import django

    django.setup()
    from django.tasks import task_backends

    return task_backends["default"].acquire("default", count=1)[0].id


# -- the server's readings ----------------------------------------------------------------


def settled_memory(client: redis.Redis) -> int:
    """Return `used_memory` without the script cache, once the server has no lazy frees pending.

    The cache of `EVAL` scripts is part of `used_memory` (the Lua heap is not) and FLUSHALL keeps
    it, so the first row to load a script would pay for it; it is left out of every reading.
    """
    deadline = time.monotonic() + 60
    while (info := client.info("memory"))["lazyfree_pending_objects"] and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return int(info["used_memory"]) - int(info.get("used_memory_scripts_eval", 0))


def flush(client: redis.Redis) -> int:
    """Empty every database, freeing at once, and return the settled `used_memory`."""
    client.execute_command("FLUSHALL", "SYNC")
    return settled_memory(client)


def key_kind(key: bytes) -> str:
    return _NUMBER.sub("<n>", _ID.sub("<id>", key.decode(errors="replace")))


def key_kinds(ctx: Context, tasks: int) -> dict[str, dict[str, Any]]:
    """Return, per database and kind of key, how many keys there are and their `MEMORY USAGE` per task."""
    kinds: dict[str, dict[str, Any]] = defaultdict(lambda: {"keys": 0, "bytes": 0})
    for name in ctx.client.info("keyspace"):
        db = ctx.db(int(name.removeprefix("db")))
        keys = list(db.scan_iter(count=1000))
        for start in range(0, len(keys), 1000):
            pipe = db.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipe.memory_usage(key, samples=0)
            for key, usage in zip(keys[start : start + 1000], pipe.execute(), strict=True):
                kind = kinds[f"{name} {key_kind(key)}"]
                kind["keys"] += 1
                kind["bytes"] += usage or 0
    ordered = sorted(kinds.items(), key=lambda item: -item[1]["bytes"])
    return {kind: {"keys": k["keys"], "bytes_per_task": round(k["bytes"] / tasks, 1)} for kind, k in ordered}


# -- one row ------------------------------------------------------------------------------


def finished_count(ctx: Context, system: str) -> int:
    """Return how many tasks of `system` have a stored result."""
    if system == "threadmill":
        return threadmill_finished(ctx)
    if system == "rq":
        return ctx.db(RQ_WORKER_DB).zcard("rq:finished:default")
    return peer_queues(1, [system])[0].finished(ctx)


def worker_command(ctx: Context, system: str) -> tuple[list[str], dict[str, str], bool]:
    """Return the worker of `system` as the drain runs it: command, extra environment, whether it exits when drained."""
    if system == "threadmill":
        return threadmill_worker(), {}, True
    if system == "rq":
        # rq's own worker, without a forked work horse per task (the same storage, 20,000 forks fewer).
        url = ctx.db(RQ_WORKER_DB).connection_pool.connection_kwargs
        rq_url = f"redis://{url['host']}:{url['port']}/{RQ_WORKER_DB}"
        return (
            ["-m", "rq.cli", "worker", "--burst", "-w", "rq.worker.SimpleWorker", "--url", rq_url, "default"],
            {},
            True,
        )
    queue = peer_queues(1, [system])[0]
    return queue.worker, queue.extra_env, False


def drain(ctx: Context, system: str, tasks: int, log_path: Path) -> float:
    """Run `system`'s worker until every task has its result, stop it, and return the seconds it took."""
    command, extra, exits = worker_command(ctx, system)
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, *command], cwd=ROOT, env=ctx.env(SETTINGS, extra), stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = started + tasks / 20 + 120
            while (done := finished_count(ctx, system)) < tasks:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{system} finished {done} of {tasks} tasks; see {log_path}")
                time.sleep(POLL_S)
            if exits:
                process.wait(timeout=60)
        finally:
            stop(process)
    return time.monotonic() - started


def measure(ctx: Context, system: str, state: str, payload: str, tasks: int, detail: bool) -> dict[str, Any]:
    """Fill an empty server with one row's tasks and return its bytes per task (and, with `detail`, where they go)."""
    before = flush(ctx.client)
    fill_in_process(ctx, system, state, payload, tasks)
    if state == "finished":
        drain(ctx, system, tasks, ctx.scratch / f"{system}-{payload.replace(' ', '')}.log")
    after = settled_memory(ctx.client)
    figures: dict[str, Any] = {"used_memory_before": before, "used_memory_after": after}
    figures["bytes_per_task"] = round((after - before) / tasks, 1)
    figures["keys"] = sum(v["keys"] for v in ctx.client.info("keyspace").values())
    if detail:
        figures["memory_usage_by_key_kind"] = key_kinds(ctx, tasks)
        if system == "threadmill":
            scratch = ctx.db(memory_fields.SCRATCH_DB)
            figures["task_hash"] = memory_fields.task_hash_report(ctx.client, scratch)
            if state == "ready":
                figures["running_task_hash"] = memory_fields.lease_report(ctx.client, scratch, lease_one(ctx))
    return figures


def lease_one(ctx: Context) -> bytes:
    """Lease one ready threadmill task the way a worker does, from a process of its own; return its hash's key."""
    command = [sys.executable, "-m", "tests.benchmarks.memory", "lease"]
    done = subprocess.run(command, cwd=ROOT, env=ctx.env(SETTINGS, {}), capture_output=True, text=True, check=True)
    return KeySchema("default").task(done.stdout.split()[-1]).encode()


def fill_in_process(ctx: Context, system: str, state: str, payload: str, tasks: int) -> None:
    command = [sys.executable, "-m", "tests.benchmarks.memory", "fill", system, state, payload, str(tasks)]
    env = ctx.env(SETTINGS, {})
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"The fill of {system} {state} {payload} failed: {done.stderr.strip()[-2000:]}")


# -- the run ------------------------------------------------------------------------------


def rows(peer_names: list[str]) -> list[tuple[str, str, str]]:
    """Return (system, state, payload) for every row of the table, threadmill's first."""
    return [(s, state, p) for s in ["threadmill", *peer_names] for state in STATES for p in PAYLOADS]


def row_name(system: str, state: str, payload: str) -> str:
    return f"{system} {state} {payload}"


def run(
    tasks: int = DEFAULT_TASKS, repeats: int = 1, peer_names: list[str] | None = None, million: bool = False
) -> dict[str, Any]:
    """Measure every row `repeats` times, interleaved (and the million row once), and print and write the medians."""
    table = rows(DEFAULT_PEERS if peer_names is None else peer_names)
    runs: dict[str, list[dict[str, Any]]] = {row_name(*row): [] for row in table}
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-memory-"))
    with valkey() as server:
        ctx = Context(server, scratch)
        version = server_version(ctx.client)
        for system in dict.fromkeys(row[0] for row in table) if repeats else ():
            fill_in_process(ctx, system, "ready", "int", WARM_UP_TASKS)
        for repeat in range(repeats):
            for row in table:
                figures = measure(ctx, *row, tasks, detail=repeat == 0)
                runs[row_name(*row)].append(figures)
                print(f"[{repeat + 1}/{repeats}] {row_name(*row)}: {figures['bytes_per_task']:,.0f} B/task", flush=True)
        big = measure_million(ctx) if million else None
        flush(ctx.client)
    # Kept when a drain fails, since the workers' logs there say why.
    shutil.rmtree(scratch, ignore_errors=True)
    figures = previous()
    figures.update({"server": version, "method": __doc__.split("\n\n")[1].replace("\n", " ")})
    if table and repeats:
        figures.update({"tasks": tasks, "repeats": repeats, "retention": RETENTION, "rows": summarise(table, runs)})
        # The table and the million row may come from different runs: each keeps what it was measured on.
        figures["rows_measured_on"] = report.machine()
        print_memory(figures)
    if big:
        figures["million"] = {**big, "measured_on": report.machine()}
        print(f"\n1,000,000 ready echo tasks: {big['used_memory_mb']:,.1f} MB ({big['bytes_per_task']:,.0f} B/task)")
    print(f"\nwrote {report.write_results('memory', figures)}")
    return figures


def previous() -> dict[str, Any]:
    """Return the figures of the last run, so the table and the million row can be measured apart."""
    path = report.RESULTS_DIR / "memory.json"
    if not path.exists():
        return {}
    figures = json.loads(path.read_text())
    return {k: v for k, v in figures.items() if k not in ("benchmark", "machine")}


def measure_million(ctx: Context) -> dict[str, Any]:
    """Enqueue a million ready echo tasks with `enqueue_many` and return the server's memory."""
    before = flush(ctx.client)
    command = [sys.executable, "-m", "tests.benchmarks.memory", "million"]
    done = subprocess.run(command, cwd=ROOT, env=ctx.env(SETTINGS, {}), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"The million-task fill failed: {done.stderr.strip()[-2000:]}")
    after = settled_memory(ctx.client)
    ready = ctx.client.zcard("threadmill:{default}:default:ready")
    return {
        "tasks": ready, "enqueue_s": round(float(done.stdout.split()[-1]), 1), "used_memory_before": before,
        "used_memory_after": after, "used_memory_mb": round((after - before) / 2**20, 1),
        "bytes_per_task": round((after - before) / ready, 1),
        "used_memory_rss_mb": round(ctx.client.info("memory")["used_memory_rss"] / 2**20, 1),
    }  # fmt: skip


def summarise(table: list[tuple[str, str, str]], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    results = {}
    for system, state, payload in table:
        name = row_name(system, state, payload)
        measured = runs[name]
        entry: dict[str, Any] = {"system": system, "state": state, "payload": payload}
        entry["bytes_per_task"] = round(report.median([r["bytes_per_task"] for r in measured]), 1)
        entry["runs_bytes_per_task"] = [r["bytes_per_task"] for r in measured]
        entry.update({k: v for k, v in measured[0].items() if isinstance(v, dict)})
        entry["runs"] = [{k: v for k, v in r.items() if not isinstance(v, dict)} for r in measured]
        results[name] = entry
    return results


def print_memory(figures: dict[str, Any]) -> None:
    by_row = figures["rows"]
    systems = list(dict.fromkeys(e["system"] for e in by_row.values()))
    header = ["system", *[f"{state} {payload}" for state in STATES for payload in PAYLOADS]]
    table = [
        [s, *[f"{by_row[row_name(s, st, p)]['bytes_per_task']:,.0f}" for st in STATES for p in PAYLOADS]]
        for s in systems
    ]
    report.print_table(
        f"server bytes per task (used_memory delta / {figures['tasks']:,}, {figures['server']}, "
        f"median of {figures['repeats']})",
        header,
        table,
    )


if __name__ == "__main__":
    if sys.argv[1] == "fill":
        fill(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    elif sys.argv[1] == "lease":
        print(lease())
    elif sys.argv[1] == "million":
        print(fill_million())
