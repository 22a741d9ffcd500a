"""Retrying an enqueue call through a blip: a restart, a short outage, a cluster failover.

An enqueue call is safe to send again. Its task ids are chosen before the first attempt, and
a retry (`resend`) tells the enqueue script to store nothing under an id whose task exists: a
call whose write landed but whose reply was lost stored those tasks then, and its retry finds
them "already stored", which counts as success. The first attempt's ids are new, so it skips
that check (one EXISTS a task). So a call that failed on an error saying the server cannot be reached
now (`is_transient`) is sent again after a short pause, until it succeeds or `enqueue_retry`
seconds have passed since its first attempt; then `ServerUnreachable` names how long it tried.

A call that succeeds at once pays one clock read: the rest is entered only on an exception.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..exceptions import BackendConnectionError, ServerUnreachable

logger = logging.getLogger("threadmill.backend")

#: Pause before the first retry, seconds; each later pause doubles it.
FIRST_PAUSE_S = 0.02
#: Longest pause between two attempts, seconds: a restarted server is noticed within this.
MAX_PAUSE_S = 0.25


def is_transient(error: BackendConnectionError) -> bool:
    """Whether `error` says the server cannot take the call now but may soon, so the call may go again.

    Connection refused or reset, a timeout, `LOADING`, a cluster's `TRYAGAIN`, `CLUSTERDOWN` and a
    redirection still wrong after a refresh, and a failover's refusals, `READONLY` (a primary
    demoted to replica, still answering on its old address), `MASTERDOWN`, `NOREPLICAS`: all
    `ServerUnreachable` (`errors.is_failover_refusal`).
    Not a full server's refusal (`ServerOutOfMemory`): memory is freed by workers draining or an
    operator, not within a retry's seconds, so the caller hears at once.
    """
    return isinstance(error, ServerUnreachable)


def pause_before(retry: int, left_s: float, jitter: float) -> float:
    """Return the seconds to wait before retry number `retry` (1 first), at most `left_s`.

    `jitter` in [0, 1) spreads the pause over its upper half, so the callers of many threads
    and processes do not all come back at the same instant.
    """
    pause = min(FIRST_PAUSE_S * 2 ** (retry - 1), MAX_PAUSE_S) * (0.5 + jitter / 2)
    return max(0.0, min(pause, left_s))


def naming(entries: Sequence[Sequence[Any]]) -> str:
    """Name the tasks of one enqueue call (entries whose first item is a task id) for a message."""
    if len(entries) == 1:
        return f"task {entries[0][0]}"
    return f"{len(entries)} tasks (the first {entries[0][0]})"


class EnqueueAttempts:
    """The attempts of one enqueue call that failed once: when it began, how many retries, when to give up."""

    __slots__ = ("budget_s", "entries", "retries", "started")

    def __init__(self, budget_s: float, entries: Sequence[Sequence[Any]], started: float) -> None:
        self.budget_s = budget_s
        self.entries = entries
        self.started = started
        self.retries = 0

    def pause_after(self, error: BackendConnectionError) -> float:
        """Count the attempt `error` failed and return the pause before the next; raise when there is none."""
        if not self.budget_s or not is_transient(error):
            raise error
        tried_s = time.monotonic() - self.started
        left_s = self.budget_s - tried_s
        if left_s <= 0:
            raise ServerUnreachable(
                f"The enqueue of {naming(self.entries)} gave up after trying for {tried_s:.1f} s "
                f"({self.retries + 1} attempts; enqueue_retry is {self.budget_s:g} s): {error}"
            ) from error
        self.retries += 1
        logger.debug("Enqueue of %s failed (%s); retry %d.", naming(self.entries), error, self.retries)
        return pause_before(self.retries, left_s, random.random())


def retrying[T](
    budget_s: float, entries: Sequence[Sequence[Any]], send: Callable[[], T], resend: Callable[[], T] | None = None
) -> tuple[T, int]:
    """Call `send` until it succeeds or `budget_s` seconds have passed; return its reply and the retries made.

    `entries` are what the call enqueues, each a sequence whose first item is a task id (named on failure).
    `resend`, when given, is called for the retries instead: the call that skips what a lost reply stored.
    """
    started = time.monotonic()
    try:
        return send(), 0
    except BackendConnectionError as e:
        attempts = EnqueueAttempts(budget_s, entries, started)
        pause = attempts.pause_after(e)
    send = resend or send
    while True:
        time.sleep(pause)
        try:
            return send(), attempts.retries
        except BackendConnectionError as e:
            pause = attempts.pause_after(e)


async def aretrying[T](
    budget_s: float,
    entries: Sequence[Sequence[Any]],
    send: Callable[[], Awaitable[T]],
    resend: Callable[[], Awaitable[T]] | None = None,
) -> tuple[T, int]:
    """`retrying` for a coroutine: the pauses are the event loop's, not a blocked thread's."""
    started = time.monotonic()
    try:
        return await send(), 0
    except BackendConnectionError as e:
        attempts = EnqueueAttempts(budget_s, entries, started)
        pause = attempts.pause_after(e)
    send = resend or send
    while True:
        await asyncio.sleep(pause)
        try:
            return await send(), attempts.retries
        except BackendConnectionError as e:
            pause = attempts.pause_after(e)
