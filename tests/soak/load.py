"""The soak's load: producer threads enqueue a mix of tasks, an operator thread works the queues.

Producers and the operator reach the server through the soak's own proxy ("client"), so
their calls fail during faults like a web process's would. A call that raised may still
have been stored (its reply was lost, or a stalled link delivered it late): its keys are
kept as *uncertain*, and the verdict counts them as enqueued only if the server has them.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from threadmill import api
from threadmill.base import Segment

from . import tasks
from .harness import QUEUES

#: What the producers enqueue, with each kind's share of the enqueue calls. `bulk` is one
#: `enqueue_many` call of many fast tasks.
KIND_WEIGHTS = {"fast": 35, "slow": 20, "flaky": 12, "doomed": 6, "deferred": 17, "bulk": 5, "limited": 8}
#: Tasks per bulk call: a burst that fills the workers' buffers for a moment.
BULK_SIZE = (10, 100)
#: Most times the operator requeues one always-failing task.
MAX_OPERATOR_REQUEUES = 2
#: The tasks that must end SUCCESSFUL; the others (`doomed`) must end FAILED.
SUCCEEDING_KINDS = frozenset({"fast", "slow", "flaky", "deferred", "bulk", "limited"})


@dataclass
class Entry:
    """One enqueued task as its producer knows it."""

    key: str
    kind: str
    queue: str
    #: Whether the enqueue call returned; False when it raised (the task may still be stored).
    confirmed: bool
    task_id: str | None = None
    at: float = 0.0
    run_after: float | None = None


class Ledger:
    """Every task the producers tried to enqueue, by key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.errors: dict[str, int] = {}

    def add(self, entries: list[Entry]) -> None:
        with self._lock:
            for entry in entries:
                self.entries[entry.key] = entry

    def error(self, where: str, error: Exception) -> None:
        name = f"{where}: {type(error).__name__}"
        with self._lock:
            self.errors[name] = self.errors.get(name, 0) + 1

    def deferred_ahead(self, now: float) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries.values() if e.task_id and e.run_after and e.run_after > now + 0.5]

    def doomed(self) -> dict[str, Entry]:
        with self._lock:
            return {e.task_id: e for e in self.entries.values() if e.kind == "doomed" and e.task_id}


class Producer(threading.Thread):
    """Enqueues a random mix through the backend, about `rate` calls a second."""

    def __init__(self, number: int, ledger: Ledger, rate: float, seed: int) -> None:
        super().__init__(name=f"producer-{number}", daemon=True)
        self.number = number
        self.ledger = ledger
        self.rate = rate
        self.rng = random.Random(f"{seed}-producer-{number}")
        self.stopping = threading.Event()
        self._keys = itertools.count()

    def key(self) -> str:
        return f"p{self.number}-{next(self._keys)}"

    def run(self) -> None:
        kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
        while not self.stopping.wait(self.rng.expovariate(self.rate)):
            self.enqueue(self.rng.choices(kinds, weights)[0])

    def enqueue(self, kind: str) -> None:
        rng = self.rng
        queue = rng.choice(QUEUES)
        using = {"queue_name": queue, "priority": rng.choice((0, 0, 5))}
        run_after = None
        if kind == "bulk":
            calls = [((), {"key": self.key(), "sleep_ms": rng.randint(0, 100)}) for _ in range(rng.randint(*BULK_SIZE))]
            self._call(
                kind, queue, [c[1]["key"] for c in calls], lambda: tasks.steady.using(**using).enqueue_many(calls)
            )
            return
        key = self.key()
        if kind == "fast":
            task, kwargs = tasks.steady, {"sleep_ms": rng.randint(0, 20)}
        elif kind == "slow":
            task, kwargs = tasks.steady, {"sleep_ms": rng.randint(500, 4000)}
        elif kind == "flaky":
            task, kwargs = tasks.flaky, {"sleep_ms": rng.randint(0, 50), "failing_attempts": rng.randint(1, 2)}
        elif kind == "doomed":
            task, kwargs = tasks.doomed, {"sleep_ms": rng.randint(0, 50)}
        elif kind == "limited":
            task, kwargs = tasks.limited, {"sleep_ms": rng.randint(0, 50)}
        else:
            run_after = time.time() + rng.uniform(0.5, 8.0)
            using["run_after"] = datetime.fromtimestamp(run_after, UTC)
            task, kwargs = tasks.steady, {"sleep_ms": rng.randint(0, 20)}
        bound = task.using(**using)
        self._call(kind, queue, [key], lambda: [bound.enqueue(key=key, **kwargs)], run_after)

    def _call(self, kind: str, queue: str, keys: list[str], call, run_after: float | None = None) -> None:
        now = time.time()
        try:
            results = call()
        except Exception as e:  # noqa: BLE001 - the server or the link is down: the call's fate is unknown
            self.ledger.error(f"enqueue {kind}", e)
            self.ledger.add([Entry(key, kind, queue, False, at=now, run_after=run_after) for key in keys])
            return
        self.ledger.add(
            [Entry(key, kind, queue, True, r.id, now, run_after) for key, r in zip(keys, results, strict=True)]
        )


@dataclass
class OperatorRecord:
    """What the operator did: queue pauses, requeues of failed tasks, orphaned tasks, deferred tasks run now."""

    pauses: int = 0
    requeued_failed: dict[str, int] = field(default_factory=dict)
    #: Task id -> epoch seconds when "requeue orphaned" moved it.
    requeued_orphaned: dict[str, float] = field(default_factory=dict)
    #: Task id -> epoch seconds when it was requeued from deferred to run now.
    ran_now: dict[str, float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


class Operator(threading.Thread):
    """Every few seconds does one thing an operator does through the tooling API (threadmill.api)."""

    ALIAS = "default"

    def __init__(self, ledger: Ledger, seed: int) -> None:
        super().__init__(name="operator", daemon=True)
        self.ledger = ledger
        self.rng = random.Random(f"{seed}-operator")
        self.stopping = threading.Event()
        self.record = OperatorRecord()
        #: Paused queue -> epoch seconds when to resume it.
        self.paused: dict[str, float] = {}

    def run(self) -> None:
        actions = [self.pause, self.requeue_failed, self.requeue_orphaned, self.run_deferred_now]
        while not self.stopping.wait(self.rng.uniform(1.0, 4.0)):
            self._attempt("resume", self.resume_due)
            action = self.rng.choice(actions)
            self._attempt(action.__name__, action)

    def _attempt(self, name: str, action) -> None:
        try:
            action()
        except Exception as e:  # noqa: BLE001 - a fault is under way; the operator tries again later
            key = f"{name}: {type(e).__name__}"
            self.record.errors[key] = self.record.errors.get(key, 0) + 1

    def pause(self) -> None:
        queue = self.rng.choice(QUEUES)
        if queue in self.paused:
            return
        self.paused[queue] = time.time() + self.rng.uniform(1.0, 5.0)
        api.controls.pause_queue(self.ALIAS, queue, by="soak operator")
        self.record.pauses += 1

    def resume_due(self, everything: bool = False) -> None:
        for queue, at in list(self.paused.items()):
            if everything or time.time() >= at:
                api.controls.resume_queue(self.ALIAS, queue)
                del self.paused[queue]

    def requeue_failed(self) -> None:
        """Requeue some always-failing tasks from the failed segment; tasks that should succeed are left to be seen."""
        doomed = self.ledger.doomed()
        for queue in QUEUES:
            page = api.page(self.ALIAS, queue, Segment.FAILED, 0, 100)
            ids = [
                item.id
                for item in page.items
                if item.id in doomed and self.record.requeued_failed.get(item.id, 0) < MAX_OPERATOR_REQUEUES
            ]
            ids = self.rng.sample(ids, min(len(ids), 10))
            if ids:
                moved = api.requeue_selected(self.ALIAS, queue, Segment.FAILED, ids).moved
                for task_id in moved:
                    self.record.requeued_failed[task_id] = self.record.requeued_failed.get(task_id, 0) + 1

    def requeue_orphaned(self) -> None:
        queue = self.rng.choice(QUEUES)
        now = time.time()
        for task_id in api.controls.requeue_orphaned(self.ALIAS, queue).moved:
            self.record.requeued_orphaned[task_id] = now

    def run_deferred_now(self) -> None:
        """Requeue one deferred task by id, as the console's "run now" does."""
        ahead = self.ledger.deferred_ahead(time.time())
        if ahead:
            entry = self.rng.choice(ahead)
            now = time.time()
            if api.requeue(self.ALIAS, entry.task_id, seen=api.Segment.DEFERRED).moved:
                self.record.ran_now[entry.task_id] = now

    def finish(self, timeout: float) -> list[str]:
        """Stop, then resume every queue paused, retrying through faults; return the queues it could not resume."""
        self.stopping.set()
        self.join(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                for queue in QUEUES:
                    api.controls.resume_queue(self.ALIAS, queue)
                self.paused.clear()
                return []
            except Exception:  # noqa: BLE001 - still recovering from the last fault
                time.sleep(0.5)
        return sorted(self.paused)
