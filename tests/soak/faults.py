"""The soak's faults: what each does, when they fire, and which repeated runs each one allows.

Three threads fire faults at random gaps (exponential, mean `--fault-gap`), each dealing its
own kinds from a shuffled deck so that every kind fires once before any fires twice: worker
processes (kill -9 of a worker process, kill -9 of a supervisor, SIGTERM of a pool, SIGSTOP
5 s and 25 s), the server (restart, kill -9, down 10 s) and the network (a proxy's
connections reset, a 15 s half-open stall, added latency). The three overlap freely. Each
fault is logged with its window (epoch seconds) and its target, which is what `allows_rerun`
reads to tell an allowed second run from an unexplained one.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from threadmill.worker.process import HEARTBEAT_TRUST_SHARE

from .harness import SHUTDOWN_GRACE_S, SHUTDOWN_TIMEOUT_S, alive_and_same, kill_if_same

if TYPE_CHECKING:
    from .__main__ import Soak

KILL_WORKER = "kill -9 worker process"
KILL_SUPERVISOR = "kill -9 supervisor"
SIGTERM_POOL = "SIGTERM pool"
STOP_SHORT = "SIGSTOP 5 s"
STOP_LONG = "SIGSTOP 25 s"
SERVER_RESTART = "server restart"
SERVER_KILL = "server kill -9"
SERVER_DOWN = "server down 10 s"
PROXY_RESET = "proxy reset"
PROXY_STALL = "proxy stall 15 s"
PROXY_LATENCY = "proxy latency"
#: The kinds each fault thread deals, in the order the table lists them.
FAMILIES = {
    "process": (KILL_WORKER, KILL_SUPERVISOR, SIGTERM_POOL, STOP_SHORT, STOP_LONG),
    "server": (SERVER_RESTART, SERVER_KILL, SERVER_DOWN),
    "network": (PROXY_RESET, PROXY_STALL, PROXY_LATENCY),
}
SERVER_KINDS = frozenset(FAMILIES["server"])
#: Seconds of each timed fault.
STOP_SHORT_S, STOP_LONG_S, SERVER_DOWN_S, PROXY_STALL_S = 5.0, 25.0, 10.0, 15.0
#: Range of the added latency each way, seconds, and how long it lasts.
LATENCY_S, LATENCY_FOR_S = (0.05, 0.3), (5.0, 15.0)
#: Seconds a finished run's acknowledgement may still wait in its process (batched for 20 ms; a
#: loaded two-core machine may take longer to send it).
ACK_WINDOW_S = 2.0
#: Seconds after an outage ends within which a held acknowledgement is sent: the worker's retry
#: pause doubles up to 2 s.
AFTER_OUTAGE_S = 3.0
#: Slack around a fault's window for a run to count as caught by it: process scheduling is not instant.
EDGE_S = 0.5
#: Longest a fault waits for a pool or its worker processes to stop, beyond the bound the README sets.
STOP_SLACK_S = 10.0


@dataclass
class FaultEvent:
    """One fault that fired: its kind, its window (epoch seconds) and its target."""

    kind: str
    started: float
    ended: float
    pid: int | None = None
    #: The pool incarnation (`a#2`) a process fault hit.
    pool: str = ""
    #: The proxy a network fault hit: "client" (the soak's own clients), or a pool's name.
    proxy: str = ""
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Run:
    """One finished run of a task, as the task recorded it on the counter server."""

    key: str
    task_id: str
    attempt: int
    pid: int
    pool: str
    started: float
    finished: float
    ok: bool

    @property
    def pool_name(self) -> str:
        return self.pool.split("#")[0]


def _running_at(run: Run, moment: float) -> bool:
    return run.started <= moment + EDGE_S and run.finished >= moment - EDGE_S


def _ack_pending_at(run: Run, moment: float, outages: list[FaultEvent]) -> bool:
    """Whether `run` had finished by `moment` with its acknowledgement possibly not yet sent.

    Within ACK_WINDOW_S of its finish, or of the end of an outage (a chain of them) that began
    before that window closed: the worker holds the outcome until the server answers again.
    """
    if run.finished > moment + EDGE_S:
        return False
    deadline = run.finished + ACK_WINDOW_S
    for outage in sorted(outages, key=lambda o: o.started):
        if outage.started - EDGE_S <= deadline and outage.ended + EDGE_S >= run.finished:
            deadline = max(deadline, outage.ended + AFTER_OUTAGE_S)
    return moment <= deadline


def allows_rerun(event: FaultEvent, run: Run, outages: list[FaultEvent], worker_timeout: float) -> bool:
    """Whether the README allows `event` to have made `run` a run that the task's record does not count.

    - kill -9 of a worker process: a run it had finished whose acknowledgement was not sent.
    - SIGSTOP, or a pool's proxy stalled, longer than worker_timeout: the run going on at the
      freeze (for a stall, any started before the process saw its heartbeats go unstored), or one finished
      just before it. Buffered tasks must not run again.
    - SIGTERM of a pool, kill -9 of its supervisor: a run that was still going at the shutdown
      timeout, handed back with its process killed after it, or one finished whose
      acknowledgement an outage held up until the stopping process exited.
    Server faults, resets and latency allow none.
    """
    long_freeze = event.ended - event.started > worker_timeout
    if event.kind == KILL_WORKER:
        return run.pid == event.pid and _ack_pending_at(run, event.started, outages)
    if event.kind in (STOP_SHORT, STOP_LONG) and long_freeze:
        return run.pid == event.pid and (
            _running_at(run, event.started) or _ack_pending_at(run, event.started, outages)
        )
    if event.kind == PROXY_STALL and long_freeze and event.proxy == run.pool_name:
        # Cut off, a process stops starting tasks once no heartbeat was stored for that share of the timeout.
        cut_off_after = worker_timeout * HEARTBEAT_TRUST_SHARE
        caught = run.started <= event.started + cut_off_after + EDGE_S and run.finished >= event.started - EDGE_S
        return caught or _ack_pending_at(run, event.started, outages)
    if event.kind in (SIGTERM_POOL, KILL_SUPERVISOR):
        # Still running at the shutdown timeout, or finished with its acknowledgement held up by an
        # outage until the stopping process had to exit: both are lost with the process.
        exit_at = event.started + SHUTDOWN_TIMEOUT_S
        return run.pool == event.pool and (run.finished >= exit_at - 1.0 or _ack_pending_at(run, exit_at, outages))
    return False


def outages_for(run: Run, events: list[FaultEvent]) -> list[FaultEvent]:
    """The faults that kept `run`'s worker from reaching the server: server faults, and stalls of its pool's proxy."""
    return [e for e in events if e.kind in SERVER_KINDS or (e.kind == PROXY_STALL and e.proxy == run.pool_name)]


class FaultLog:
    """Every fault fired, and every harness finding (a pool that would not stop, a fault that failed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[FaultEvent] = []
        self.findings: list[str] = []
        self.notes: list[str] = []

    def add(self, event: FaultEvent) -> None:
        with self._lock:
            self.events.append(event)
        print(f"  fault: {event.kind} {event.pool or event.proxy or ''} {event.note}".rstrip(), flush=True)

    def finding(self, text: str) -> None:
        with self._lock:
            self.findings.append(text)
        print(f"  FINDING: {text}", flush=True)

    def note(self, text: str) -> None:
        """Something worth knowing that breaks no promise (a pool that cannot start while the server is down)."""
        with self._lock:
            self.notes.append(text)
        print(f"  note: {text}", flush=True)


# -- the faults ---------------------------------------------------------------------------


def _pick_worker(soak: Soak, rng: random.Random):
    pools = [pool for pool in soak.pools if pool.running() and pool.workers()]
    if not pools:
        return None, None
    pool = rng.choice(pools)
    return pool, rng.choice(pool.workers())


def kill_worker(soak: Soak, rng: random.Random) -> FaultEvent | None:
    pool, pid = _pick_worker(soak, rng)
    if pid is None:
        return None
    now = time.time()
    os.kill(pid, signal.SIGKILL)
    return FaultEvent(KILL_WORKER, now, now, pid=pid, pool=pool.label)


def sigstop(seconds: float, kind: str):
    def freeze(soak: Soak, rng: random.Random) -> FaultEvent | None:
        pool, pid = _pick_worker(soak, rng)
        if pid is None:
            return None
        began = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # The freeze itself.
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return FaultEvent(kind, began, time.time(), pid=pid, pool=pool.label)

    return freeze


def _watch_old_workers(soak: Soak, label: str, workers: dict[int, float], bound: float) -> None:
    """Report (and kill) worker processes of a stopped incarnation still alive `bound` seconds on."""

    def watch() -> None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and any(alive_and_same(p, c) for p, c in workers.items()):
            time.sleep(0.2)
        left = [p for p, c in workers.items() if alive_and_same(p, c)]
        if left:
            soak.log.finding(f"worker processes {left} of pool {label} were still alive {bound:g} s after it stopped")
            for pid in left:
                kill_if_same(pid, workers[pid])

    threading.Thread(target=watch, name=f"watch-{label}", daemon=True).start()


def _snapshot(pool) -> dict[int, float]:
    pids = pool.workers()
    return {pid: pool.seen[pid][0] for pid in pids}


def kill_supervisor(soak: Soak, rng: random.Random) -> FaultEvent | None:
    pool = rng.choice(soak.pools)
    with pool.lock:
        label, workers = pool.label, _snapshot(pool)
        now = time.time()
        pool.kill()
        pool.start()
    _watch_old_workers(soak, label, workers, SHUTDOWN_TIMEOUT_S + SHUTDOWN_GRACE_S + STOP_SLACK_S)
    return FaultEvent(KILL_SUPERVISOR, now, now, pool=label, note=f"(restarted as {pool.label})")


def sigterm_pool(soak: Soak, rng: random.Random) -> FaultEvent | None:
    pool = rng.choice(soak.pools)
    with pool.lock:
        label, workers = pool.label, _snapshot(pool)
        now = time.time()
        bound = SHUTDOWN_TIMEOUT_S + SHUTDOWN_GRACE_S + STOP_SLACK_S
        code = pool.stop(bound)
        took = time.time() - now
        if code is None:
            soak.log.finding(f"pool {label} did not exit within {bound:g} s of SIGTERM; killed")
            pool.kill()
        pool.start()
    _watch_old_workers(soak, label, workers, 2.0)
    return FaultEvent(
        SIGTERM_POOL, now, now, pool=label, note=f"(exit {code} after {took:.1f} s, restarted as {pool.label})"
    )


def server_fault(kind: str):
    def strike(soak: Soak, rng: random.Random) -> FaultEvent:
        with soak.server.lock:
            began = time.time()
            if kind == SERVER_RESTART:
                soak.server.restart()
            elif kind == SERVER_KILL:
                soak.server.kill9_and_restart()
            else:
                soak.server.down_for(SERVER_DOWN_S)
            return FaultEvent(kind, began, time.time())

    return strike


def _pick_proxy(soak: Soak, rng: random.Random) -> str:
    return rng.choice(sorted(soak.proxies))


def proxy_reset(soak: Soak, rng: random.Random) -> FaultEvent:
    name = _pick_proxy(soak, rng)
    now = time.time()
    count = soak.proxies[name].reset()
    return FaultEvent(PROXY_RESET, now, now, proxy=name, note=f"({count} connections)")


def proxy_stall(soak: Soak, rng: random.Random) -> FaultEvent:
    name = _pick_proxy(soak, rng)
    began = time.time()
    soak.proxies[name].stall(PROXY_STALL_S)
    time.sleep(PROXY_STALL_S)  # The stall ends by itself; the thread waits it out so network faults do not overlap.
    return FaultEvent(PROXY_STALL, began, began + PROXY_STALL_S, proxy=name)


def proxy_latency(soak: Soak, rng: random.Random) -> FaultEvent:
    name = _pick_proxy(soak, rng)
    delay, lasting = rng.uniform(*LATENCY_S), rng.uniform(*LATENCY_FOR_S)
    began = time.time()
    soak.proxies[name].latency(delay)
    try:
        time.sleep(lasting)  # The fault itself.
    finally:
        soak.proxies[name].normal()
    return FaultEvent(PROXY_LATENCY, began, time.time(), proxy=name, note=f"({delay * 1000:.0f} ms each way)")


FAULTS = {
    KILL_WORKER: kill_worker,
    KILL_SUPERVISOR: kill_supervisor,
    SIGTERM_POOL: sigterm_pool,
    STOP_SHORT: sigstop(STOP_SHORT_S, STOP_SHORT),
    STOP_LONG: sigstop(STOP_LONG_S, STOP_LONG),
    SERVER_RESTART: server_fault(SERVER_RESTART),
    SERVER_KILL: server_fault(SERVER_KILL),
    SERVER_DOWN: server_fault(SERVER_DOWN),
    PROXY_RESET: proxy_reset,
    PROXY_STALL: proxy_stall,
    PROXY_LATENCY: proxy_latency,
}


class FaultThread(threading.Thread):
    """Fires one family's faults at random gaps until stopped; a fault under way is finished first."""

    def __init__(self, soak: Soak, family: str, mean_gap_s: float, warmup_s: float, seed: int) -> None:
        super().__init__(name=f"faults-{family}", daemon=True)
        self.soak = soak
        self.kinds = FAMILIES[family]
        self.mean_gap_s = mean_gap_s
        self.warmup_s = warmup_s
        self.rng = random.Random(f"{seed}-{family}")
        self.stopping = threading.Event()
        self._deck: list[str] = []

    def _next_kind(self) -> str:
        if not self._deck:
            self._deck = list(self.kinds)
            self.rng.shuffle(self._deck)
        return self._deck.pop()

    def run(self) -> None:
        if self.stopping.wait(self.warmup_s + self.rng.uniform(0, self.mean_gap_s)):
            return
        while not self.stopping.is_set():
            kind = self._next_kind()
            try:
                event = FAULTS[kind](self.soak, self.rng)
            except Exception as e:  # noqa: BLE001 - a harness failure is a finding, not the end of the soak
                self.soak.log.finding(f"the fault {kind!r} failed: {type(e).__name__}: {e}")
                event = None
            if event is not None:
                self.soak.log.add(event)
            if self.stopping.wait(self.rng.expovariate(1 / self.mean_gap_s)):
                return
