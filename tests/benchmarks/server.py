"""A throwaway Valkey for one benchmark, and the readings taken from it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator

import psutil
import redis

from threadmill.embedded import EmbeddedValkey, free_port

#: Commands the harness itself sends (statistics, resets, connection handshakes, and the
#: ZCOUNT and DBSIZE polls of the drain benchmark, which no measured queue sends); never counted.
HARNESS_COMMANDS = frozenset(
    {"config|resetstat", "config|get", "info", "flushall", "ping", "dbsize", "zcount", "select", "hello",
     "client|setinfo"}
)  # fmt: skip


@contextlib.contextmanager
def valkey() -> Iterator[EmbeddedValkey]:
    """Start a Valkey on a free port in a temporary directory and remove both afterwards."""
    data_dir = tempfile.mkdtemp(prefix="threadmill-bench-")
    server = EmbeddedValkey(data_dir, free_port(), persist=False).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def server_version(client: redis.Redis) -> str:
    """Return the server's name and version, such as `valkey 9.1.0`."""
    info = client.info("server")
    name = "valkey" if "valkey_version" in info else "redis"
    return f"{name} {info.get('valkey_version') or info['redis_version']}"


def command_stats(client: redis.Redis) -> dict[str, dict[str, float]]:
    """Return `INFO commandstats` as {command: {calls, usec}}, without the harness's own commands."""
    stats = {}
    for key, value in client.info("commandstats").items():
        name = key.removeprefix("cmdstat_")
        if name not in HARNESS_COMMANDS:
            stats[name] = {"calls": int(value["calls"]), "usec": int(value["usec"])}
    return stats


def server_cpu_s(server: EmbeddedValkey) -> float:
    """Return the CPU seconds the server process has used so far."""
    times = psutil.Process(server.process.pid).cpu_times()
    return times.user + times.system
