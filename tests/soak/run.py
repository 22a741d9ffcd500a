"""The soak's phases: start the pools, load and break them for N minutes, drain, judge, report."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import TYPE_CHECKING

import redis

from tests.benchmarks.report import machine
from threadmill.base import Segment

from .faults import FAMILIES, STOP_SLACK_S, FaultThread
from .harness import SHUTDOWN_GRACE_S, SHUTDOWN_TIMEOUT_S, SOAK_TIMEOUTS, worker_timeout_s
from .load import Ledger, Operator, Producer
from .verdict import Judge, Verdict, print_report, read_runs, scan, summary

if TYPE_CHECKING:
    from .__main__ import Soak

#: Seconds without faults before the first one fires.
WARMUP_S = 10.0
#: Seconds between two progress lines.
PROGRESS_S = 30.0
#: Longest wait for a fault under way to finish once the soak stops them: a 25 s SIGSTOP, a 15 s stall.
FAULT_JOIN_S = 60.0
_OPEN = (Segment.READY, Segment.DEFERRED, Segment.RUNNING)


def run(soak: Soak) -> Verdict | None:
    args = soak.args
    backend = soak.direct_backend()
    for pool in soak.pools:
        pool.start()
    threading.Thread(target=soak.monitor, name="monitor", daemon=True).start()
    soak.wait_for_heartbeats(backend, 2 * args.processes)
    ledger = Ledger()
    producers = [Producer(n, ledger, args.rate, args.seed) for n in range(args.producers)]
    operator = Operator(ledger, args.seed)
    faults = [FaultThread(soak, family, args.fault_gap, WARMUP_S, args.seed) for family in FAMILIES]
    started = soak.started_at = time.time()
    print(f"soak: {args.minutes:g} min, seed {args.seed}, scratch {soak.scratch}", flush=True)
    for thread in [*producers, operator, *faults]:
        thread.start()
    try:
        _load_for(args.minutes * 60, backend, ledger, soak, started)
    finally:
        for thread in [*producers, *faults]:
            thread.stopping.set()
        for thread in [*producers, *faults]:
            thread.join(FAULT_JOIN_S)
    load_s = time.time() - started
    _heal(soak)
    unresumed = operator.finish(60.0)
    if unresumed:
        soak.log.finding(f"the operator could not resume {unresumed} within 60 s")
    drained_s = _drain(backend, args.drain_timeout)
    if drained_s is None:
        soak.log.finding(f"the queues did not drain within {args.drain_timeout:g} s")
    _stop_pools(soak)
    runs, starts = read_runs(redis.Redis.from_url(soak.counter.url))
    judge = Judge(soak.log.events, operator.record, worker_timeout_s(), started)
    verdict = judge.judge(ledger.entries, scan(backend), runs, starts)
    drained = "NOT within the bound" if drained_s is None else f"in {drained_s:.1f} s"
    header = (
        f"Soak of {load_s / 60:.1f} min (seed {args.seed}), {len(soak.log.events)} faults, drained {drained}; "
        f"worker_timeout {worker_timeout_s():g} s, two pools of {args.processes} x {args.threads}"
    )
    print_report(verdict, soak.log.events, soak.log.findings, header)
    for text in soak.log.notes:
        print(f"\nNote: {text}")
    _write(args.output, soak, verdict, ledger, operator, load_s, drained_s)
    print(f"\nwrote {args.output}")
    return verdict


def _load_for(seconds: float, backend, ledger: Ledger, soak: Soak, started: float) -> None:
    end = time.monotonic() + seconds
    next_line = time.monotonic() + PROGRESS_S
    while time.monotonic() < end:
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        if time.monotonic() >= next_line:
            next_line += PROGRESS_S
            print(f"  {time.time() - started:6.0f} s: {len(ledger.entries):,} enqueue keys, "
                  f"{len(soak.log.events)} faults, {_segments(backend)}", flush=True)  # fmt: skip


def _segments(backend) -> str:
    try:
        stats = backend.queue_stats()
    except Exception as e:  # noqa: BLE001 - the server is down for a fault
        return f"server unreachable ({type(e).__name__})"
    totals = {s: sum(q.get(s, 0) for q in stats.values()) for s in Segment}
    return ", ".join(f"{s} {n:,}" for s, n in totals.items() if n)


def _heal(soak: Soak) -> None:
    """End every network fault and bring the server back, should a fault have left it down."""
    for proxy in soak.proxies.values():
        proxy.normal()
    with soak.server.lock:
        soak.server.ensure_up()


def _drain(backend, timeout: float) -> float | None:
    """Wait until no queue has a ready, deferred or running task; the seconds it took, or None past `timeout`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        with contextlib.suppress(Exception):
            stats = backend.queue_stats()
            if not any(q.get(s, 0) for q in stats.values() for s in _OPEN):
                return time.monotonic() - began
        time.sleep(0.2)
    return None


def _stop_pools(soak: Soak) -> None:
    soak.stopping.set()  # The monitor restarts no pool from now on.
    bound = SHUTDOWN_TIMEOUT_S + SHUTDOWN_GRACE_S + STOP_SLACK_S
    for pool in soak.pools:
        with pool.lock:
            if pool.running() and pool.stop(bound) is None:
                soak.log.finding(f"pool {pool.label} did not exit within {bound:g} s of the final SIGTERM")
                pool.kill()


def _write(path, soak: Soak, verdict: Verdict, ledger: Ledger, operator: Operator, load_s: float, drained_s) -> None:
    record = operator.record
    figures = {
        "benchmark": "soak",
        "machine": machine(),
        "arguments": {k: str(v) if k == "output" else v for k, v in vars(soak.args).items()},
        "options": SOAK_TIMEOUTS,
        "started_at": soak.started_at,
        "load_s": round(load_s, 1),
        "drained_s": None if drained_s is None else round(drained_s, 1),
        "passed": not verdict.failed and not soak.log.findings,
        "summary": summary(verdict),
        "findings": soak.log.findings,
        "notes": soak.log.notes,
        "faults": [e.as_dict() for e in soak.log.events],
        "pool_exits_unasked": [exit for pool in soak.pools for exit in pool.unexpected_exits],
        "producer_errors": ledger.errors,
        "operator": {
            "pauses": record.pauses,
            "requeued_failed": sum(record.requeued_failed.values()),
            "requeued_orphaned": len(record.requeued_orphaned),
            "ran_deferred_now": len(record.ran_now),
            "errors": record.errors,
        },
        "problems": verdict.problems,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2) + "\n")
