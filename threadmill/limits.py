"""Per-queue and per-task concurrency and rate limits: parsing, and each partition's share.

A queue's **concurrency** N: at most N of its tasks leased at once, counted by its running
segment (a prefetched task not yet started counts). Its **rate** "N/unit" (unit s, m or h):
at most N leases in any window of one unit. acquire keeps the queue's last N lease times
(the server's clock): a bucket of N tokens, each coming back one unit after it was spent, so
the burst is N at once and no window of one unit ever holds more than N.

With `partitions` P > 1 each partition enforces its share in its own slot (a script cannot
count across slots on a cluster): partition p gets N // P, plus 1 when p < N % P, so the
shares add up to N exactly. A limit must be at least P (a partition with no share would
never run its tasks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: Seconds of each rate unit.
RATE_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: Most leases a rate may allow per unit: acquire keeps one timestamp per lease in the last unit.
MAX_RATE_COUNT = 100_000

# ASCII digits, bounded: str.isdigit() also passes '²', which int() refuses with a bare ValueError,
# as it does a run of digits past its 4,300-digit limit.
_RATE = re.compile(r"([0-9]{1,18})/([smh])")
_CONCURRENCY = re.compile(r"\s*(-?[0-9]{1,18})\s*")


class LimitError(ValueError):
    """Raised when a concurrency or rate limit is not one Threadmill can enforce."""


@dataclass(frozen=True, slots=True)
class Rate:
    """`count` leases per `unit` ("s", "m" or "h")."""

    count: int
    unit: str

    @property
    def period_s(self) -> float:
        return RATE_UNITS_S[self.unit]

    def __str__(self) -> str:
        return f"{self.count}/{self.unit}"


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """A queue's limits; None is no limit of that kind."""

    concurrency: int | None = None
    rate: Rate | None = None

    def as_json(self) -> dict[str, int | str | None]:
        return {"concurrency": self.concurrency, "rate": None if self.rate is None else str(self.rate)}


NO_LIMIT = QueueLimit()
#: `encode(NO_LIMIT)`: what acquire reads for a queue with no limit in the settings.
UNLIMITED = "||"


def parse_rate(text: object) -> Rate:
    """Return "N/s", "N/m" or "N/h" as a Rate; LimitError naming what is wrong otherwise."""
    match = _RATE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise LimitError(f"A rate is N/s, N/m or N/h with N a whole number, not {text!r}.")
    count = int(match[1])
    if not 1 <= count <= MAX_RATE_COUNT:
        raise LimitError(f"A rate allows 1 to {MAX_RATE_COUNT:,} per unit, not {count}.")
    return Rate(count, match[2])


def parse_concurrency(value: object) -> int:
    """Return a concurrency limit, a whole number of at least 1; LimitError otherwise."""
    match = _CONCURRENCY.fullmatch(value) if isinstance(value, str) else None
    if match is not None:
        value = int(match[1])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LimitError(f"A concurrency limit is a whole number of at least 1, not {value!r}.")
    return value


def parse_limit(raw: object) -> QueueLimit:
    """Return a {"concurrency": N, "rate": "N/unit"} mapping as a QueueLimit; LimitError naming what is wrong."""
    if not isinstance(raw, dict):
        raise LimitError(f"A queue's limits are a dict with 'concurrency' and/or 'rate', not {raw!r}.")
    unknown = sorted(set(raw) - {"concurrency", "rate"})
    if unknown:
        raise LimitError(f"Unknown limit(s) {', '.join(map(repr, unknown))}; the limits are 'concurrency' and 'rate'.")
    concurrency = raw.get("concurrency")
    rate = raw.get("rate")
    return QueueLimit(
        None if concurrency is None else parse_concurrency(concurrency), None if rate is None else parse_rate(rate)
    )


def check_partitions(limit: QueueLimit, partitions: int) -> None:
    """Raise LimitError when a limit is below the partition count (some partition would get no share)."""
    for name, value in (("concurrency", limit.concurrency), ("rate", None if limit.rate is None else limit.rate.count)):
        if value is not None and value < partitions:
            raise LimitError(
                f"A {name} limit of {value} is below the {partitions} partitions: each partition enforces a share "
                f"of it, at least 1."
            )


def share(total: int, partition: int, partitions: int) -> int:
    """Return partition p's share of a limit: `total // P`, plus 1 for the first `total % P` partitions.

    The scripts' rule is `share` in lua/lib/limits.lua; this one serves the reads that run no script
    (tests/backends/test_lua_lib.py asserts the two agree).
    """
    return total // partitions + (1 if partition < total % partitions else 0)


def encode(limit: QueueLimit) -> str:
    """Return a limit as acquire reads it: "concurrency|rate count|rate period seconds", "" for none."""
    if limit.rate is None:
        return f"{limit.concurrency or ''}||"
    return f"{limit.concurrency or ''}|{limit.rate.count}|{limit.rate.period_s:g}"


class Acquired(list):
    """What acquire leased, and whether a limit held back ready tasks (`held_back`).

    `next_token_s`: seconds until the first rate token of a held-back queue comes back (None when
    only concurrency held them back: the acknowledgement that frees a slot wakes a waiting worker).
    """

    held_back: bool = False
    next_token_s: float | None = None

    def hold(self, reply: bytes | str) -> None:
        """Read acquire's `held` reply: "" none, "-1" concurrency only, else seconds to the next token."""
        text = reply.decode() if isinstance(reply, bytes) else str(reply)
        if text:
            self.held_back = True
            wait = float(text)
            if wait >= 0 and (self.next_token_s is None or wait < self.next_token_s):
                self.next_token_s = wait


def next_token_s(rate: Rate | None, lease_time: bytes | None, server_time: Sequence[bytes]) -> float | None:
    """Seconds until a partition's next rate token comes back; None while it has one (or there is no rate).

    `lease_time` is the partition's N-th newest lease time (N its share of the rate), None when it kept fewer;
    `server_time` the server's TIME reply.
    """
    if rate is None or lease_time is None:
        return None
    now = int(server_time[0]) + int(server_time[1]) / 1e6
    spent = float(lease_time)
    if spent <= now - rate.period_s:
        return None
    return max(0.0, spent + rate.period_s - now)


def decode(text: bytes | str | None) -> QueueLimit:
    """Return a stored "concurrency|rate count|rate period s" as a QueueLimit (its empty parts None)."""
    if not text:
        return NO_LIMIT
    concurrency, count, period = (text.decode() if isinstance(text, bytes) else text).split("|")
    units = {seconds: unit for unit, seconds in RATE_UNITS_S.items()}
    rate = Rate(int(count), units[float(period)]) if count else None
    return QueueLimit(int(concurrency) if concurrency else None, rate)


def overlay(setting: QueueLimit, runtime: QueueLimit) -> QueueLimit:
    """Return the limits in force: each part set at runtime wins over the setting's."""
    return QueueLimit(
        setting.concurrency if runtime.concurrency is None else runtime.concurrency,
        setting.rate if runtime.rate is None else runtime.rate,
    )


#: Most ready tasks acquire looks at past the head of a queue that holds tasks with a per-task limit:
#: tasks whose limit is reached are left in place, and the ones behind them served (lua/lib/look.lua).
TASK_LIMIT_LOOK = 100


def limit_suffix(task: object) -> str:
    """Return "|<path>|<limit>" for a task with `concurrency=` or `rate=`, "" for any other (a workflow script's form)."""
    path, limit = task_limit(task)
    return f"|{path}|{limit}" if path else ""


def task_limit(task: object) -> tuple[str, str]:
    """Return (task path, encoded limit) of a task with `concurrency=` or `rate=`, ("", "") for any other."""
    concurrency, rate = getattr(task, "concurrency", None), getattr(task, "rate", None)
    if concurrency is None and rate is None:
        return ("", "")
    limit = QueueLimit(concurrency, None if rate is None else parse_rate(rate))
    return (task.module_path, encode(limit))  # type: ignore[attr-defined]
