"""Backend benchmark: server cost of acquire per payload size, and Redis commands per task.

Drives `RedisTaskBackend` directly with the `echo` task from tests/tasks.py (settings
`tests.settings` pointed at this benchmark's own Valkey). Every figure comes from
`INFO commandstats`, reset with `CONFIG RESETSTAT` right before the phase it measures,
so it is the server's own service time, free of client and network noise.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import redis

from . import report
from .server import command_stats, server_version, valkey

#: Payload sizes the acquire cost is measured at, bytes of the stored document.
PAYLOAD_SIZES = {"447 B": 447, "5.4 KB": 5400}
#: Tasks enqueued for each measurement.
DEFAULT_TASKS = 20_000
#: The worker's default prefetch batch for one thread (4 x threads).
DEFAULT_BATCH = 4
#: Lease holder name the benchmark acquires under.
WORKER = "bench:1"
QUEUE = "default"


def setup_django(redis_url: str) -> None:
    """Configure Django with tests.settings pointed at `redis_url`."""
    os.environ["THREADMILL_TEST_REDIS_URL"] = redis_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()


def echo_value(payload_bytes: int) -> str:
    """Return the echo argument that makes the stored document `payload_bytes` long."""
    from tests.tasks import echo
    from threadmill.backends import codec

    bare = codec.encode_new(echo, codec.new_task_id(), [""], {}, time.time())
    return "x" * (payload_bytes - len(bare.encode()))


def enqueue(tasks: int, value: str) -> list:
    """Enqueue `tasks` echo tasks through the backend and return their results."""
    from tests.tasks import echo

    return [echo.enqueue(value) for _ in range(tasks)]


def stored_payload_bytes(client: redis.Redis, backend, task_id: str) -> int:
    return client.hstrlen(backend.keys.task(task_id), "data")


def acquire_all(backend, tasks: int, count: int) -> list:
    """Acquire exactly `tasks` tasks in calls of `count`, without the empty call that ends a drain."""
    leased = []
    for _ in range(math.ceil(tasks / count)):
        leased += backend.acquire(QUEUE, count=count, worker=WORKER)
    assert len(leased) == tasks, f"acquired {len(leased)} of {tasks} tasks"
    return leased


def acknowledge_all(backend, leased: list, batch: int) -> None:
    """Mark every leased task successful and acknowledge them `batch` at a time."""
    from datetime import UTC, datetime

    from threadmill.outcome import mark_successful

    now = datetime.now(UTC)
    for result in leased:
        mark_successful(result, now)
    for start in range(0, len(leased), batch):
        chunk = leased[start : start + batch]
        accepted = backend.acknowledge_many([(r, r.args[0]) for r in chunk])
        assert all(accepted), "an acknowledgement was refused"


def phase_stats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """Return this phase's command statistics and reset them for the next phase."""
    stats = command_stats(client)
    client.config_resetstat()
    return stats


def evalsha(stats: dict[str, dict[str, float]]) -> dict[str, float]:
    entry = stats.get("evalsha", {"calls": 0, "usec": 0})
    return {"calls": entry["calls"], "usec": entry["usec"]}


def measure_acquire(client: redis.Redis, backend, tasks: int, value: str, count: int) -> dict[str, float]:
    """Return the EVALSHA cost of acquiring `tasks` queued tasks `count` at a time."""
    client.flushall()
    enqueue(tasks, value)
    client.config_resetstat()
    acquire_all(backend, tasks, count)
    stats = phase_stats(client)
    cost = evalsha(stats)
    return {
        "calls": cost["calls"],
        "usec_per_call": cost["usec"] / cost["calls"],
        "usec_per_task": cost["usec"] / tasks,
        "inner_usec_per_call": {
            name: entry["usec"] / cost["calls"] for name, entry in sorted(stats.items()) if name != "evalsha"
        },
    }


def measure_round_trip(client: redis.Redis, backend, tasks: int, value: str, batch: int) -> dict[str, Any]:
    """Return commands and EVALSHA time per task for enqueue, acquire and acknowledge of `tasks`.

    Acquire and acknowledge both go `batch` tasks per call, as a worker with that
    prefetch does; calls made inside scripts count, since the server runs each one.
    """
    client.flushall()
    client.config_resetstat()
    enqueue(tasks, value)
    phases = {"enqueue": phase_stats(client)}
    leased = acquire_all(backend, tasks, batch)
    phases["acquire"] = phase_stats(client)
    acknowledge_all(backend, leased, batch)
    phases["acknowledge"] = phase_stats(client)
    by_command: dict[str, int] = {}
    for stats in phases.values():
        for name, entry in stats.items():
            by_command[name] = by_command.get(name, 0) + entry["calls"]
    return {
        "commands_per_task": sum(by_command.values()) / tasks,
        "phase_commands_per_task": {p: sum(e["calls"] for e in s.values()) / tasks for p, s in phases.items()},
        "phase_evalsha_usec_per_task": {p: evalsha(s)["usec"] / tasks for p, s in phases.items()},
        "command_calls_per_task": {name: calls / tasks for name, calls in sorted(by_command.items())},
    }


def run(tasks: int = DEFAULT_TASKS, repeats: int = 5) -> dict[str, Any]:
    """Run the backend benchmark and print and write its figures."""
    with valkey() as server:
        setup_django(server.url)
        from django.tasks import task_backends

        backend = task_backends["default"]
        client = redis.Redis.from_url(server.url)
        version = server_version(client)
        acquire: dict[str, Any] = {}
        for label, size in PAYLOAD_SIZES.items():
            value = echo_value(size)
            probe = enqueue(1, value)[0]
            actual = stored_payload_bytes(client, backend, probe.id)
            for count in (1, DEFAULT_BATCH):
                runs = [measure_acquire(client, backend, tasks, value, count) for _ in range(repeats)]
                key = f"{label}, count={count}"
                acquire[key] = {
                    "payload_bytes": actual,
                    "count": count,
                    "usec_per_call_runs": [round(r["usec_per_call"], 3) for r in runs],
                    "usec_per_call": round(report.median([r["usec_per_call"] for r in runs]), 3),
                    "usec_per_task": round(report.median([r["usec_per_task"] for r in runs]), 3),
                    "inner_usec_per_call": {
                        name: round(report.median([r["inner_usec_per_call"].get(name, 0) for r in runs]), 3)
                        for name in runs[0]["inner_usec_per_call"]
                    },
                }
                print(f"acquire {key}: {acquire[key]['usec_per_call']:.2f} us per EVALSHA", flush=True)
        value = echo_value(PAYLOAD_SIZES["447 B"])
        round_trip = {}
        for batch in (1, DEFAULT_BATCH):
            runs = [measure_round_trip(client, backend, tasks, value, batch) for _ in range(repeats)]
            round_trip[f"batch={batch}"] = median_round_trip(runs)
        figures = {"server": version, "tasks": tasks, "repeats": repeats, "acquire": acquire, "round_trip": round_trip}
        print_backend(figures)
        print(f"\nwrote {report.write_results('backend', figures)}")
        return figures


def median_round_trip(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return the run whose commands per task is the median, with the median EVALSHA times."""
    runs = sorted(runs, key=lambda r: r["commands_per_task"])
    chosen = runs[len(runs) // 2]
    chosen["phase_evalsha_usec_per_task"] = {
        phase: round(report.median([r["phase_evalsha_usec_per_task"][phase] for r in runs]), 3)
        for phase in chosen["phase_evalsha_usec_per_task"]
    }
    return chosen


def print_backend(figures: dict[str, Any]) -> None:
    rows = [
        [key, entry["payload_bytes"], f"{entry['usec_per_call']:.2f}", f"{entry['usec_per_task']:.2f}",
         report.spread(entry["usec_per_call_runs"])]
        for key, entry in figures["acquire"].items()
    ]  # fmt: skip
    report.print_table(
        f"acquire, EVALSHA service time ({figures['server']}, {figures['tasks']:,} tasks, median of {figures['repeats']})",
        ["payload, count", "bytes", "us/call", "us/task", "runs us/call"],
        rows,
    )
    rows = []
    for key, entry in figures["round_trip"].items():
        phases = entry["phase_commands_per_task"]
        times = entry["phase_evalsha_usec_per_task"]
        rows.append([key, f"{entry['commands_per_task']:.2f}", *(f"{phases[p]:.2f} / {times[p]:.2f}" for p in phases)])
    report.print_table(
        "enqueue + acquire + acknowledge, Redis commands per task (scripts' inner calls included)",
        ["acquire/ack batch", "commands/task", "enqueue cmds / us", "acquire cmds / us", "acknowledge cmds / us"],
        rows,
    )
    for key, entry in figures["acquire"].items():
        detail = ", ".join(f"{name} {usec:.2f}" for name, usec in entry["inner_usec_per_call"].items())
        print(f"  acquire {key}, commands inside the script, us per EVALSHA: {detail}")
    for key, entry in figures["round_trip"].items():
        detail = ", ".join(f"{name} {calls:.2f}" for name, calls in entry["command_calls_per_task"].items())
        print(f"  {key}: {detail}")
