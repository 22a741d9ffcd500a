"""Remote-server benchmark: the drain again, with the worker reaching Valkey through a delay proxy.

Users do not run Redis on the worker's host. Each queue drains the drain benchmark's echo
tasks (`-w 1 -t 1`, every peer reading 128 ahead, results stored) three ways in every
repeat: straight to the server (local), through the forwarder of tests/benchmarks/delay.py
adding nothing (what the forwarder itself costs), and through it holding every chunk
0.25 ms each way, about a hop within one cloud zone. Only the worker goes through the
forwarder; the tasks are enqueued straight to the server. The figure that matters is each
queue's remote rate as a share of its local one, paired within a repeat, because that is
how much of the round trip it hides; its share of the rate through the bare forwarder
leaves the forwarder's own cost out. The forwarder's CPU is read over each whole drain
(it carries nothing but the worker's traffic), and the PING round trip through each
forwarder is measured at the start, so the delay it really adds is on record.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import redis

from . import report
from .delay import DelayProxy
from .drain import (
    PEER_PREFETCH,
    Context,
    QueueUnderTest,
    drain_once,
    peer_queues,
    summarise,
    threadmill_queue,
    worker_rejects,
)
from .server import server_version, valkey

#: Tasks per drain unless told otherwise: three drains per queue and repeat, so half the drain's.
DEFAULT_DEPTH = 10_000
#: Fewer tasks for the peers, which drain at 250 to 700 a second remote: their drains stay under 10 s.
DEPTH_CAPS = {"dramatiq": 5_000, "celery": 2_500}
#: Added each way, milliseconds: about one hop within a cloud zone.
REMOTE_DELAY_MS = 0.25
#: How the worker reaches the server in each drain: straight, or through a forwarder of this delay (ms).
MODES: dict[str, float | None] = {"local": None, "proxy 0 ms": 0.0, f"proxy {REMOTE_DELAY_MS:g} ms": REMOTE_DELAY_MS}
#: The remote mode.
REMOTE = f"proxy {REMOTE_DELAY_MS:g} ms"
#: The paired shares reported: (mode, baseline), each the median of mode's rate over baseline's in the same repeat.
SHARES = (("proxy 0 ms", "local"), (REMOTE, "local"), (REMOTE, "proxy 0 ms"))
#: PINGs timed through each path to report the round trip it adds.
ROUND_TRIP_PINGS = 1_000
DEFAULT_PEERS = ["dramatiq", "celery"]


#: Threadmill's rows: the worker's arguments and the note of each.
THREADMILL_ROWS = {
    "threadmill --prefetch-count auto": (["--prefetch-count", "auto"], "buffer sized by time"),
    "threadmill --prefetch-count 4": (["--prefetch-count", "4"], "fixed, 4 per thread"),
}


def queues_under_test(depth: int, peer_names: list[str]) -> tuple[list[QueueUnderTest], dict[str, str]]:
    """Return the rows to drain, and the threadmill rows this checkout's worker refuses, with its reason."""
    queues, skipped = [], {}
    for name, (arguments, note) in THREADMILL_ROWS.items():
        if reason := worker_rejects(arguments):
            skipped[name] = reason
            print(f"{name}: not run, the worker refuses it: {reason}", flush=True)
        else:
            queues.append(threadmill_queue(name, arguments, note, depth))
    peers = [replace(q, depth=min(q.depth, DEPTH_CAPS.get(q.name, q.depth))) for q in peer_queues(depth, peer_names)]
    return queues + peers, skipped


def round_trip_us(port: int) -> float:
    """Return the median PING round trip through `port`, in microseconds."""
    client = redis.Redis(host="127.0.0.1", port=port)
    client.ping()
    times = []
    for _ in range(ROUND_TRIP_PINGS):
        before = time.perf_counter()
        client.ping()
        times.append(time.perf_counter() - before)
    client.close()
    return round(statistics.median(times) * 1e6, 1)


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def drain_through(ctx: Context, queue: QueueUnderTest, proxy: DelayProxy | None, tag: str) -> dict[str, Any]:
    """Drain `queue` once with its worker on `proxy` (None: straight to the server)."""
    worker_env = None
    if proxy is not None:
        worker_env = {"BENCH_REDIS_URL": proxy.url(), "THREADMILL_TEST_REDIS_URL": proxy.url()}
        before = cpu_s(proxy.pid)
    figures = drain_once(ctx, queue, timeout=queue.depth / 20 + 120, worker_env=worker_env, tag=tag)
    if proxy is not None:
        figures["proxy_cpu_us_per_task"] = (cpu_s(proxy.pid) - before) / queue.depth * 1e6
    return figures


def run(depth: int = DEFAULT_DEPTH, repeats: int = 3, peer_names: list[str] | None = None) -> dict[str, Any]:
    """Drain every queue in every mode `repeats` times, interleaved, and print and write the medians."""
    peer_names = DEFAULT_PEERS if peer_names is None else peer_names
    queues, skipped = queues_under_test(depth, peer_names)
    scratch = Path(tempfile.mkdtemp(prefix="threadmill-remote-"))
    runs: dict[str, dict[str, list]] = {q.name: {mode: [] for mode in MODES} for q in queues}
    with valkey() as server:
        ctx = Context(server, scratch)
        proxies: dict[str, DelayProxy] = {}
        try:
            for mode, delay in MODES.items():
                if delay is not None:
                    proxies[mode] = DelayProxy(server.port, delay)
            round_trips = {"local": round_trip_us(server.port)}
            round_trips.update({mode: round_trip_us(proxy.port) for mode, proxy in proxies.items()})
            print("PING round trip: " + ", ".join(f"{m} {us:,.0f} us" for m, us in round_trips.items()), flush=True)
            for repeat in range(repeats):
                for queue in queues:
                    # The modes' order turns each repeat, so none always drains first after a filling.
                    order = list(MODES)[repeat % len(MODES) :] + list(MODES)[: repeat % len(MODES)]
                    for mode in order:
                        figures = drain_through(ctx, queue, proxies.get(mode), tag=f"-{mode.replace(' ', '_')}")
                        runs[queue.name][mode].append(figures)
                        print(
                            f"[{repeat + 1}/{repeats}] {queue.name}, {mode}: {figures['tasks_per_s']:,.0f} tasks/s",
                            flush=True,
                        )
            version = server_version(ctx.client)
        finally:
            for proxy in proxies.values():
                proxy.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    results = {q.name: summarise_modes(q, runs[q.name]) for q in queues}
    figures = {
        "server": version,
        "repeats": repeats,
        "delay_ms": REMOTE_DELAY_MS,
        "peer_prefetch": PEER_PREFETCH,
        "round_trip_us": round_trips,
        "queues": results,
        "skipped": skipped,
    }
    print_remote(figures)
    print(f"\nwrote {report.write_results('remote', figures)}")
    return figures


def summarise_modes(queue: QueueUnderTest, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Return each mode's medians and the paired shares, repeat by repeat."""
    entry = {"depth": queue.depth, "worker": " ".join(queue.worker), "note": queue.note, "modes": {}}
    for mode, mode_runs in runs.items():
        summary = summarise(queue, mode_runs)
        entry["modes"][mode] = {k: v for k, v in summary.items() if k not in ("depth", "worker", "note")}
    entry["paired_shares"] = {}
    for mode, baseline in SHARES:
        pairs = zip(runs[mode], runs[baseline], strict=True)
        share = report.median([r["tasks_per_s"] / b["tasks_per_s"] for r, b in pairs])
        entry["paired_shares"][share_label(mode, baseline)] = round(share, 3)
    return entry


def share_label(mode: str, baseline: str) -> str:
    return f"{mode} / {baseline}"


def print_remote(figures: dict[str, Any]) -> None:
    rows = []
    for name, entry in figures["queues"].items():
        modes = entry["modes"]
        rows.append([
            name, f"{entry['depth']:,}", *(f"{modes[m]['tasks_per_s']:,.0f}" for m in MODES),
            *(f"{entry['paired_shares'][share_label(*pair)]:.0%}" for pair in SHARES),
            f"{modes[REMOTE]['proxy_cpu_us_per_task']:.0f}", f"{modes[REMOTE]['redis_commands_per_task']:.1f}",
        ])  # fmt: skip
    trips = ", ".join(f"{m} {us:,.0f} µs" for m, us in figures["round_trip_us"].items())
    report.print_table(
        f"remote drain, 1 process x 1 thread, echo task, {figures['delay_ms']:g} ms each way "
        f"({figures['server']}, median of {figures['repeats']}; PING {trips})",
        ["queue", "tasks", *(f"tasks/s {m}" for m in MODES), *(f"{share_label(*pair)} (paired)" for pair in SHARES),
         "proxy us CPU/task", "Redis cmds/task"],
        rows,
    )  # fmt: skip
    for name, reason in figures["skipped"].items():
        print(f"not run: {name} ({reason})")
