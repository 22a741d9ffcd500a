"""The soak's verdict: every task enqueued against what the server holds and what really ran.

For each task the producers tried to enqueue, by its key:

- **lost**: its enqueue call returned, and the server has no such task at the end.
- **run twice**: it finished more runs (counter server) than its record counts (one for
  SUCCESSFUL, one per error of its own `SoakFailure`). Each extra run is *explained* when a
  fault the README allows to cause it caught that run (faults.allows_rerun), else *unexplained*.
- **stuck**: after the drain it is still ready, deferred or running, or it was only recovered
  when its lease expired (an `AcknowledgementTimeout`): recovery is promised within seconds.
- **wrong final state**: a task that should succeed is FAILED (except one that really lost
  its worker three times in a row, the poison rule: counted apart), one that always fails is
  SUCCESSFUL, one is SUCCESSFUL without a finished run, is stored twice, or is unreadable.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis
from django.tasks import TaskResultStatus

from threadmill.base import Segment, UnreadableTask
from threadmill.exceptions import AcknowledgementTimeout, WorkerLost
from threadmill.outcome import WORKER_LOSS_LIMIT, class_path

from .faults import EDGE_S, PROXY_STALL, FaultEvent, Run, allows_rerun, outages_for
from .harness import QUEUES
from .load import SUCCEEDING_KINDS, Entry, OperatorRecord
from .tasks import SOAK_FAILURE

#: Tasks read per page of the final scan.
SCAN_PAGE = 500
#: Problems of each kind printed in full; the JSON file has all of them.
PRINTED_PROBLEMS = 10
#: Seconds either side of a problem run within which faults are listed beside it.
NEARBY_S = 30.0
#: Seconds after a freeze or a stall ends within which a run counts as started "just after" it, as a suspect.
RESUMED_S = 3.0
WORKER_LOST = class_path(WorkerLost)
ACK_TIMEOUT = class_path(AcknowledgementTimeout)
_KEY = re.compile(rb'"key":\s*"([^"]+)"')


@dataclass
class Stored:
    """A task as the server holds it at the end."""

    task_id: str
    segment: Segment
    status: str = ""
    errors: list[str] = field(default_factory=list)
    unreadable: bool = False


def scan(backend) -> dict[str, list[Stored]]:
    """Read every task of every segment of every queue, by the key its producer gave it."""
    found: dict[str, list[Stored]] = {}
    for queue in QUEUES:
        for segment in Segment:
            after = None
            while True:
                page = backend.peek_page(queue, segment=segment, after=after, count=SCAN_PAGE)
                for item in page.items:
                    key, stored = _stored(item, segment)
                    found.setdefault(key, []).append(stored)
                if page.next_cursor is None:
                    break
                after = page.next_cursor
    return found


def _stored(item, segment: Segment) -> tuple[str, Stored]:
    if isinstance(item, UnreadableTask):
        match = _KEY.search(item.raw or b"")
        return (match.group(1).decode() if match else f"?{item.id}"), Stored(item.id, segment, unreadable=True)
    errors = [e.exception_class_path for e in item.errors]
    return item.kwargs.get("key", f"?{item.id}"), Stored(item.id, segment, str(item.status), errors)


def read_runs(counter: redis.Redis) -> tuple[dict[str, list[Run]], Counter]:
    """Every finished run by key, and every start by key, from the counter server."""
    runs: dict[str, list[Run]] = {}
    total = counter.llen("soak:runs")
    for start in range(0, total, 10_000):
        for raw in counter.lrange("soak:runs", start, start + 9_999):
            r = json.loads(raw)
            run = Run(r["key"], r["id"], r["attempt"], r["pid"], r["pool"], r["started"], r["finished"], r["ok"])
            runs.setdefault(run.key, []).append(run)
    started = Counter({k.decode(): int(v) for k, v in counter.hgetall("soak:started").items()})
    return runs, started


@dataclass
class Verdict:
    enqueued: int = 0
    not_stored: int = 0
    stored_despite_error: int = 0
    runs: int = 0
    interrupted_runs: int = 0
    by_kind: dict[str, Counter] = field(default_factory=dict)
    explained_by: Counter = field(default_factory=Counter)
    problems: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {
            "lost": [], "run_twice_explained": [], "run_twice_unexplained": [], "stuck": [],
            "wrong_final_state": [], "failed_by_faults": [],
        }
    )  # fmt: skip

    def count(self, name: str) -> int:
        return len(self.problems[name])

    @property
    def failed(self) -> bool:
        return any(self.count(n) for n in ("lost", "run_twice_unexplained", "stuck", "wrong_final_state"))


class Judge:
    """Classifies every task; `soak_started` (epoch) makes the printed times relative."""

    def __init__(self, events: list[FaultEvent], operator: OperatorRecord, worker_timeout: float, soak_started: float):
        self.events = events
        self.operator = operator
        self.worker_timeout = worker_timeout
        self.t0 = soak_started

    def judge(self, entries: dict[str, Entry], stored: dict[str, list[Stored]], runs, started) -> Verdict:
        verdict = Verdict()
        for key, entry in entries.items():
            copies = stored.get(key, [])
            if not copies:
                if entry.confirmed:
                    verdict.problems["lost"].append(self._problem(entry, None, runs.get(key, []), "not on the server"))
                else:
                    verdict.not_stored += 1
                continue
            verdict.enqueued += 1
            verdict.stored_despite_error += not entry.confirmed
            task_runs = runs.get(key, [])
            verdict.runs += len(task_runs)
            verdict.interrupted_runs += max(0, started.get(key, 0) - len(task_runs))
            kind = verdict.by_kind.setdefault(entry.kind, Counter())
            kind["enqueued"] += 1
            kind[copies[0].status or "UNREADABLE"] += 1
            self._classify(verdict, entry, copies, task_runs, started.get(key, 0))
        return verdict

    def _classify(self, verdict: Verdict, entry: Entry, copies: list[Stored], runs: list[Run], starts: int) -> None:
        task = copies[0]
        wrong = self._wrong(entry, copies, runs, starts)
        if task.segment in (Segment.READY, Segment.DEFERRED, Segment.RUNNING):
            verdict.problems["stuck"].append(self._problem(entry, task, runs, f"still {task.segment} after the drain"))
        elif ACK_TIMEOUT in task.errors:
            reason = "recovered only when its lease expired (AcknowledgementTimeout)"
            verdict.problems["stuck"].append(self._problem(entry, task, runs, reason))
        elif wrong == "poison":
            reason = f"FAILED after losing its worker {WORKER_LOSS_LIMIT} times in a row, each a run cut short"
            verdict.problems["failed_by_faults"].append(self._problem(entry, task, runs, reason))
        elif wrong:
            verdict.problems["wrong_final_state"].append(self._problem(entry, task, runs, wrong))
        recorded = (task.status == TaskResultStatus.SUCCESSFUL) + task.errors.count(SOAK_FAILURE)
        extra = len(runs) - recorded
        if extra > 0 and not task.unreadable:
            self._rerun(verdict, entry, task, runs, extra)
        elif extra < 0 and not wrong:
            reason = f"its record counts {recorded} finished runs, it finished {len(runs)}"
            verdict.problems["wrong_final_state"].append(self._problem(entry, task, runs, reason))

    def _wrong(self, entry: Entry, copies: list[Stored], runs: list[Run], starts: int) -> str:
        task = copies[0]
        if len(copies) > 1:
            return f"stored {len(copies)} times: {', '.join(f'{c.task_id} ({c.segment})' for c in copies)}"
        if task.unreadable:
            return "unreadable"
        if task.status == TaskResultStatus.SUCCESSFUL and not any(r.ok for r in runs):
            return "SUCCESSFUL without a run that returned"
        if entry.kind in SUCCEEDING_KINDS and task.status == TaskResultStatus.FAILED:
            lost_in_a_row = task.errors[-WORKER_LOSS_LIMIT:] == [WORKER_LOST] * WORKER_LOSS_LIMIT
            if lost_in_a_row and starts - len(runs) >= WORKER_LOSS_LIMIT:
                return "poison"
            return f"FAILED ({', '.join(e.rsplit('.', 1)[-1] for e in task.errors[-4:])})"
        if entry.kind not in SUCCEEDING_KINDS and task.status == TaskResultStatus.SUCCESSFUL:
            return "SUCCESSFUL, but it fails every attempt"
        return ""

    def _rerun(self, verdict: Verdict, entry: Entry, task: Stored, runs: list[Run], extra: int) -> None:
        causes = []
        for run in runs:
            kinds = [
                e.kind for e in self.events if allows_rerun(e, run, outages_for(run, self.events), self.worker_timeout)
            ]
            if kinds:
                causes.append(kinds[0])
        reason = f"finished {len(runs)} runs, its record counts {len(runs) - extra}"
        if len(causes) >= extra:
            verdict.explained_by.update(causes[:extra])
            verdict.problems["run_twice_explained"].append(
                self._problem(entry, task, runs, f"{reason}; {causes[:extra]}")
            )
        else:
            problem = self._problem(entry, task, runs, reason)
            problem["suspects"] = self._suspects(problem["task_id"], runs)
            verdict.problems["run_twice_unexplained"].append(problem)

    def _suspects(self, task_id: str, runs: list[Run]) -> list[str]:
        """What may have caused an unexplained second run, for the reader: the operator's doings, a fault just over."""
        out = []
        for what, moments in (
            ("requeued as orphaned", self.operator.requeued_orphaned),
            ("run now", self.operator.ran_now),
        ):
            if task_id in moments:
                out.append(f"the operator's {what} at {moments[task_id] - self.t0:.2f} s")
        for event in self.events:
            for run in runs:
                same = run.pid == event.pid or (event.kind == PROXY_STALL and event.proxy == run.pool_name)
                if same and event.ended - EDGE_S <= run.started <= event.ended + RESUMED_S:
                    out.append(f"started {run.started - event.ended:.2f} s after its worker's {event.kind} ended")
        return out

    def _problem(self, entry: Entry, task: Stored | None, runs: list[Run], reason: str) -> dict[str, Any]:
        """A problem with what a reader needs to chase it: the runs, the faults around them, the operator's doings."""
        times = [r.started for r in runs] + [r.finished for r in runs] or [entry.at]
        near = [e for e in self.events if e.started - NEARBY_S <= max(times) and e.ended + NEARBY_S >= min(times)]
        task_id = task.task_id if task else entry.task_id
        return {
            "key": entry.key,
            "kind": entry.kind,
            "queue": entry.queue,
            "task_id": task_id,
            "reason": reason,
            "segment": str(task.segment) if task else None,
            "errors": task.errors if task else [],
            "enqueued_at_s": round(entry.at - self.t0, 2),
            "runs": [
                f"attempt {r.attempt} pid {r.pid} ({r.pool}) {r.started - self.t0:.2f}..{r.finished - self.t0:.2f} s"
                f"{'' if r.ok else ' raised'}"
                for r in sorted(runs, key=lambda r: r.started)
            ],
            "faults_nearby": [
                f"{e.kind} {e.pool or e.proxy or ''} pid {e.pid} {e.started - self.t0:.2f}..{e.ended - self.t0:.2f} s"
                for e in near
            ],
            "operator": {
                "requeued_orphaned_at_s": _relative(self.operator.requeued_orphaned.get(task_id), self.t0),
                "ran_now_at_s": _relative(self.operator.ran_now.get(task_id), self.t0),
                "requeued_failed": self.operator.requeued_failed.get(task_id, 0),
            },
        }


def _relative(moment: float | None, t0: float) -> float | None:
    return None if moment is None else round(moment - t0, 2)


# -- the table -------------------------------------------------------------------------------

COLUMNS = ("lost", "run_twice_explained", "run_twice_unexplained", "stuck", "wrong_final_state")


def summary(verdict: Verdict) -> dict[str, Any]:
    """The table's figures, for the JSON file."""
    return {
        "enqueued": verdict.enqueued,
        **{name: verdict.count(name) for name in COLUMNS},
        "failed_by_faults": verdict.count("failed_by_faults"),
        "enqueue_calls_failed_not_stored": verdict.not_stored,
        "stored_although_the_enqueue_call_failed": verdict.stored_despite_error,
        "finished_runs": verdict.runs,
        "runs_cut_short": verdict.interrupted_runs,
        "run_twice_explained_by": dict(verdict.explained_by),
        "by_kind": {kind: dict(counts) for kind, counts in sorted(verdict.by_kind.items())},
    }


def print_report(verdict: Verdict, events: list[FaultEvent], findings: list[str], header: str) -> None:
    """Print the soak's table, the faults that fired, and each problem found (the first few of each kind)."""
    figures = summary(verdict)
    print(f"\n{header}\n")
    print("| enqueued | lost | run twice, explained | run twice, unexplained | stuck | wrong final state |")
    print("|---|---|---|---|---|---|")
    print(f"| {verdict.enqueued:,} | " + " | ".join(f"{verdict.count(n):,}" for n in COLUMNS) + " |")
    explained = ", ".join(f"{kind} {n}" for kind, n in verdict.explained_by.most_common()) or "none"
    print(
        f"\nRun twice, explained by: {explained}. FAILED by the poison rule after {WORKER_LOSS_LIMIT} real worker "
        f"losses in a row: {verdict.count('failed_by_faults')}. Finished runs {verdict.runs:,}, runs cut short by a "
        f"fault {verdict.interrupted_runs:,}. Enqueue calls that raised: {verdict.not_stored:,} of their tasks "
        f"not stored, {verdict.stored_despite_error:,} stored anyway (counted as enqueued)."
    )
    fired = Counter(e.kind for e in events)
    print("\n| fault | fired |\n|---|---|")
    for kind, n in sorted(fired.items()):
        print(f"| {kind} | {n} |")
    print("\n| kind | enqueued | SUCCESSFUL | FAILED |\n|---|---|---|---|")
    for kind, counts in figures["by_kind"].items():
        print(
            f"| {kind} | {counts.get('enqueued', 0):,} | {counts.get('SUCCESSFUL', 0):,} | {counts.get('FAILED', 0):,} |"
        )
    for text in findings:
        print(f"\nHarness finding: {text}")
    for name in ("lost", "run_twice_unexplained", "stuck", "wrong_final_state"):
        problems = verdict.problems[name]
        for problem in problems[:PRINTED_PROBLEMS]:
            print(f"\n{name}: {problem['kind']} task {problem['task_id']} ({problem['key']}): {problem['reason']}")
            print(f"  errors {[e.rsplit('.', 1)[-1] for e in problem['errors']]}; runs: {'; '.join(problem['runs'])}")
            for suspect in problem.get("suspects", []):
                print(f"  suspect: {suspect}")
        if len(problems) > PRINTED_PROBLEMS:
            print(f"\n... and {len(problems) - PRINTED_PROBLEMS} more {name} in the JSON file.")
