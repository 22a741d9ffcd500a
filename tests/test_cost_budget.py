"""The cost budget: what a plain task, an enqueue and an idle worker cost the server, held to tests/cost_budget.toml.

Every figure comes from the session Valkey's own counters, `INFO commandstats` after a
`CONFIG RESETSTAT` (calls inside scripts count as commands), and from the data a run leaves
stored, read key by key. The drain is a real pool, the drain benchmark's `manage.py threadmill
worker --exit-empty -w 1 -t 1`, with the backend's options at their defaults
(tests/settings_defaults.py) rather than the suite's shortened ones; the idle worker is the same
pool with nothing to do, counted over a window. A figure above its budget fails with both numbers: raising one is a reviewed change to
the budget file, with the reason beside the figure.
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.tasks import echo
from tests.worker.conftest import DEADLINE_S, Worker, wait_until
from threadmill.backends.keys import KeySchema
from threadmill.base import Segment

BUDGET_PATH = Path(__file__).with_name("cost_budget.toml")
BUDGET_NAME = "tests/cost_budget.toml"
#: The backend at its default options: what a site gets out of the box.
DEFAULT_SETTINGS = "tests.settings_defaults"
#: The one command the harness sends inside a counted window (INFO's own call is counted after its reply).
HARNESS_COMMANDS = frozenset({"config|resetstat"})
#: Tasks of the drain that warms the server's script cache before the counted one.
WARM_UP_TASKS = 20
#: Seconds the idle pool's client count must hold still before its window opens.
IDLE_SETTLED_S = 2.0


def default_env() -> dict[str, str]:
    return dict(os.environ, DJANGO_SETTINGS_MODULE=DEFAULT_SETTINGS, PYTHONUNBUFFERED="1")


def budget() -> dict[str, Any]:
    with BUDGET_PATH.open("rb") as f:
        return tomllib.load(f)


def reset_counters(client: redis.Redis) -> None:
    client.config_resetstat()


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Return the calls of each command since the last reset (`INFO commandstats`), the harness's own left out."""
    calls = {}
    for key, value in client.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name not in HARNESS_COMMANDS:
            calls[name] = int(value["calls"])
    return calls


def script_calls(calls: dict[str, int]) -> int:
    return sum(
        n
        for name, n in calls.items()
        if name.split("|")[0] in ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
    )


def stored_bytes(client: redis.Redis) -> int:
    """Return the bytes of every key stored: its name plus its content, as written, whatever the server's encoding.

    A string counts its value; a hash its field names and values; a list or set its members; a
    sorted set its members plus 8 bytes a score (a double).
    """
    total = 0
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "string":
            content = client.strlen(key)
        elif kind == "hash":
            content = sum(len(f) + len(v) for f, v in client.hgetall(key).items())
        elif kind == "list":
            content = sum(len(v) for v in client.lrange(key, 0, -1))
        elif kind == "set":
            content = sum(len(v) for v in client.smembers(key))
        elif kind == "zset":
            content = sum(len(m) + 8 for m in client.zrange(key, 0, -1))
        else:
            raise AssertionError(f"The budget does not know how to size key {key!r} of type {kind}.")
        total += len(key) + content
    return total


def per_call(calls: dict[str, int], stored: int, count: int) -> dict[str, Any]:
    """Return the commands, script calls and stored bytes per task (or enqueue) of `count`, and the calls by name."""
    return {
        "commands": sum(calls.values()) / count,
        "scripts": script_calls(calls) / count,
        "stored_bytes": stored / count,
        "by_command": calls,
    }


def drain(client: redis.Redis, tasks: int) -> dict[str, Any]:
    """Enqueue `tasks` echo tasks, drain them with a default pool, and return the drain's costs per task."""
    # A first small drain loads every script the pool sends into the server's cache (as on a running
    # site), so the counted one pays no SCRIPT LOAD; the flush keeps the scripts.
    enqueue_echoes(WARM_UP_TASKS)
    run_pool_until_drained()
    client.flushall()
    enqueue_echoes(tasks)
    reset_counters(client)
    run_pool_until_drained()
    calls = command_calls(client)
    successful = client.zcard(KeySchema("default").segment("default", Segment.SUCCESSFUL))
    assert successful == tasks, f"{successful} of {tasks} tasks finished"
    return per_call(calls, stored_bytes(client), tasks)


def enqueue_echoes(tasks: int) -> None:
    echo.enqueue_many([((i,), {}) for i in range(tasks)])


def run_pool_until_drained() -> None:
    """Run a default pool with `--exit-empty` until it drained the queue and exited."""
    worker = Worker("--exit-empty", "-w", "1", "-t", "1", "-q", "default", env=default_env())
    try:
        code = worker.process.wait(DEADLINE_S)
        assert code == 0, f"the pool exited with {code}: {worker.output}"
    finally:
        worker.close()


def enqueue_one(client: redis.Redis) -> dict[str, Any]:
    """Enqueue one echo task into an empty store (connection and scripts warm) and return what it cost."""
    echo.enqueue(0)
    client.flushall()
    reset_counters(client)
    echo.enqueue(1)
    return per_call(command_calls(client), stored_bytes(client), 1)


def idle(client: redis.Redis, window_s: float) -> dict[str, Any]:
    """Start a default pool with nothing to do, and return its commands per second over `window_s` at rest."""
    worker = Worker("-w", "1", "-t", "1", "-q", "default", env=default_env())
    try:
        wait_until(lambda: "started" in worker.output, "the idle pool's process started")
        settled(client)
        reset_counters(client)
        started = time.monotonic()
        # The window itself, not a wait for a condition: the pool's cost at rest is a rate.
        time.sleep(window_s)
        calls = command_calls(client)
        seconds = time.monotonic() - started
        assert worker.process.poll() is None, worker.output
    finally:
        worker.close()
    return {"commands_per_s": sum(calls.values()) / seconds, "window_s": seconds, "by_command": calls}


def settled(client: redis.Redis) -> None:
    """Wait until the server's client count held still for IDLE_SETTLED_S (the pool has opened its connections)."""
    count, since = None, time.monotonic()

    def still() -> bool:
        nonlocal count, since
        now_count = client.info("clients")["connected_clients"]
        if now_count != count:
            count, since = now_count, time.monotonic()
        return time.monotonic() - since >= IDLE_SETTLED_S

    wait_until(still, f"the server's client count held still for {IDLE_SETTLED_S:g} s")


# -- the budget ---------------------------------------------------------------------------


def over_budget(section: str, measured: dict[str, float]) -> list[str]:
    """Return a line for each figure of `measured` above its budget in `section` of the budget file."""
    limits = budget()[section]
    return [
        f"{section}.{name}: budget {limits[name]:g}, measured {value:.6g}"
        for name, value in measured.items()
        if value > limits[name]
    ]


def figures(measured: dict[str, Any]) -> dict[str, float]:
    return {name: measured[name] for name in ("commands", "scripts", "stored_bytes")}


def assert_within_budget(section: str, measured: dict[str, float], detail: dict[str, int]) -> None:
    over = over_budget(section, measured)
    assert not over, (
        f"Over the cost budget: {'; '.join(over)} (calls by command: {dict(sorted(detail.items()))}). "
        f"Raising a budget is a reviewed change to {BUDGET_NAME}, with its reason beside the figure."
    )


@pytest.fixture(scope="module")
def plain_drain(redis_url) -> dict[str, Any]:
    """The costs of one default drain of plain echo tasks, measured once for the tests that read them."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    return drain(client, budget()["drain"]["tasks"])


@pytest.mark.slow
def test_a_plain_drain_stays_within_its_budget(plain_drain):
    assert_within_budget("drain", figures(plain_drain), plain_drain["by_command"])


@pytest.mark.slow
def test_a_plain_drain_runs_exactly_the_baseline_commands(plain_drain):
    allowed = set(budget()["drain"]["command_names"])
    seen = set(plain_drain["by_command"])
    changes = [
        f"{what}: {sorted(names)}" for what, names in (("new", seen - allowed), ("gone", allowed - seen)) if names
    ]
    assert seen == allowed, (
        f"A plain drain's command names differ from the budget's command_names ({'; '.join(changes)}). A plain task "
        f"pays only for what it uses: changing the set is a reviewed change to {BUDGET_NAME}, with its reason."
    )


def test_one_enqueue_stays_within_its_budget(redis_url):
    measured = enqueue_one(redis.Redis.from_url(redis_url))
    assert_within_budget("enqueue", figures(measured), measured["by_command"])


@pytest.mark.slow
def test_an_idle_worker_stays_within_its_budget(redis_url):
    measured = idle(redis.Redis.from_url(redis_url), budget()["idle"]["window_s"])
    assert_within_budget("idle", {"commands_per_s": measured["commands_per_s"]}, measured["by_command"])
