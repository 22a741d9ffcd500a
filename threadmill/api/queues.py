"""Reading queues through a backend: which backends and queues exist, a segment's pages, one task, the server's memory.

A page's rows and its total come from one round trip, whatever the segment's depth. With
several partitions a segment's merged order is paged by cursor (`keyset_page`): a cursor is
a place in the order, (score, task id), written in a URL as `<score>~<task id>`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend

from ..backends.merge import Cursor, KeysetPage
from ..backends.redis import RedisTaskBackend
from ..base import Segment
from ..exceptions import BackendConnectionError, UnsupportedServer

#: Most segment entries a filtered view scans; past it, its count is a lower bound.
FILTER_SCAN_LIMIT = 100_000

# Matched with fullmatch: a `$` anchor would also pass a path with a trailing newline.
_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# A cursor as a URL carries it: a score as the server writes one (a decimal, or ±inf), "~",
# and a task id of the shape the console's task URLs accept. A two-digit exponent keeps the
# score in a double's range: the server refuses one that overflows, as an error, not a page.
_CURSOR = re.compile(r"([+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?(?:[eE][+-]?[0-9]{1,2})?|inf))~([A-Za-z0-9_.:-]{1,100})")


def backend_aliases() -> list[str]:
    """Return the aliases of every configured threadmill backend, in settings order."""
    from django.conf import settings

    return [alias for alias in settings.TASKS if isinstance(task_backends[alias], RedisTaskBackend)]


def find_backend(alias: str) -> RedisTaskBackend:
    """Return the threadmill backend of `alias` as configured, without reaching its server; LookupError naming what is wrong."""
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        defined = ", ".join(sorted(task_backends.settings))
        raise LookupError(f"Unknown task backend {alias!r}; TASKS defines {defined}.") from None
    if not isinstance(backend, RedisTaskBackend):
        raise LookupError(f"Task backend {alias!r} is {type(backend).__name__}, not a Threadmill backend.")  # noqa: TRY004 - a lookup, not a type check
    return backend


def get_backend(alias: str) -> RedisTaskBackend:
    """Return the threadmill backend of `alias`, its data layout checked (once); LookupError when there is none.

    Raises LayoutVersionError when the alias's stored layout is one this code cannot read.
    """
    backend = find_backend(alias)
    backend.check_layout()
    return backend


def reach(alias: str) -> RedisTaskBackend:
    """Return the threadmill backend of `alias` after a round trip to its server and a check of its data layout.

    Raises LookupError (no such backend), BackendConnectionError (its server cannot be reached),
    UnsupportedServer (the preflight refuses the server: too old; checked before anything is
    written to it) or LayoutVersionError (its stored layout is one this code cannot read).
    """
    backend = find_backend(alias)
    backend.ping()
    if refusal := backend.preflight().refusal:
        raise UnsupportedServer(refusal)
    backend.check_layout()
    return backend


def unreachable_backends() -> list[str]:
    """Return the aliases of the threadmill backends whose server does not answer a PING now, in settings order.

    One PING per backend and nothing read or checked besides: cheap enough for a readiness probe
    every few seconds.
    """
    unreachable = []
    for alias in backend_aliases():
        try:
            find_backend(alias).ping()
        except BackendConnectionError:
            unreachable.append(alias)
    return unreachable


def queue_names(alias: str) -> list[str]:
    """Return the names of a backend's queues, in settings order."""
    return get_backend(alias).queue_names()


def has_queue(alias: str, queue_name: str) -> bool:
    """Return whether a backend knows the queue (configured, or a task was ever enqueued on it)."""
    return queue_name in get_backend(alias).queue_names()


@dataclass(frozen=True, slots=True)
class Filter:
    """A segment view's filter: a task path and an error class path, each optional."""

    task_path: str = ""
    error_class: str = ""
    #: Text the stored task contains (its arguments, mostly), matched as typed, case and all.
    text: str = ""

    def __post_init__(self) -> None:
        for name, value in (("task path", self.task_path), ("error class", self.error_class)):
            if value and (len(value) > 200 or not _DOTTED_PATH.fullmatch(value)):
                raise ValueError(f"The {name} filter must be a dotted Python path, such as 'myapp.tasks.send'.")
        if len(self.text) > 200:
            raise ValueError("The search text must be at most 200 characters.")

    def __bool__(self) -> bool:
        return bool(self.task_path or self.error_class or self.text)

    def matches(self, item) -> bool:
        """Return whether a peeked task passes the filter (an unreadable one only passes no filter)."""
        if not self:
            return True
        if not hasattr(item, "task"):
            return False
        error = item.errors[-1].exception_class_path if item.errors else ""
        found = not self.text or self.text in json.dumps([item.args, item.kwargs], ensure_ascii=False, default=str)
        return self.task_path in ("", item.task.module_path) and self.error_class in ("", error) and found

    @property
    def needles(self) -> list[str]:
        """The exact JSON fragments a matching stored document contains."""
        out = []
        if self.task_path:
            out.append(f'"path":{json.dumps(self.task_path)}')
        if self.error_class:
            out.append(f'"exception_class_path":{json.dumps(self.error_class)}')
        if self.text:
            # As the codec stores a string: JSON-escaped, non-ASCII kept as it is.
            out.append(json.dumps(self.text, ensure_ascii=False)[1:-1])
        return out


#: The filter of an unfiltered view.
NO_FILTER = Filter()


@dataclass(frozen=True, slots=True)
class SegmentPage:
    """One page of a (possibly filtered) segment: rows, total, and whether the total is exact."""

    items: list
    total: int
    exact: bool = True


def page(
    alias: str,
    queue_name: str,
    segment: Segment,
    offset: int,
    count: int,
    where: Filter = NO_FILTER,
    newest_first: bool | None = None,
) -> SegmentPage:
    """Return one page of a segment, filtered or not, with its total, in one round trip.

    `newest_first` None keeps the segment's natural order (finished segments newest first).
    """
    found, complete = get_backend(alias).peek_matching(
        queue_name,
        segment=segment,
        needles=where.needles,
        offset=offset,
        count=count,
        scan_limit=FILTER_SCAN_LIMIT,
        newest_first=newest_first,
    )
    return SegmentPage(found.items, found.total, complete)


def is_partitioned(alias: str) -> bool:
    """Return whether an alias's tasks may lie in several partitions, so its segment pages merge them."""
    return len(get_backend(alias).covered_partitions()) > 1


def keyset_page(
    alias: str,
    queue_name: str,
    segment: Segment,
    *,
    after: Cursor | None = None,
    before: Cursor | None = None,
    count: int = 50,
    newest_first: bool | None = None,
) -> KeysetPage:
    """Return the page of a segment after (or before) a cursor, with its total: one script call a partition, at any depth.

    `after` is the `next_cursor` of the page before, `before` the `previous_cursor` of the
    page after; with neither, the first page. `newest_first` None keeps the segment's natural order.
    """
    return get_backend(alias).peek_page(
        queue_name, segment=segment, after=after, before=before, count=count, newest_first=newest_first
    )


def encode_cursor(cursor: Cursor) -> str:
    """Return a cursor as a URL carries it: `<score>~<task id>` (both characters URL-safe as they are)."""
    score, task_id = cursor
    return f"{score}~{task_id}"


def decode_cursor(text: str) -> Cursor:
    """Return the cursor a URL carries; ValueError, naming the problem, for anything but `<score>~<task id>`."""
    found = _CURSOR.fullmatch(text)
    if found is None:
        raise ValueError(
            f"A page cursor is a score and a task id joined by '~', such as '1700000000.5~<task id>', not {text[:40]!r}."
        )
    return found[1], found[2]


def natural_newest_first(segment: Segment) -> bool:
    """Return whether a segment lists newest first by default (finished and unreadable ones do)."""
    return segment in (Segment.SUCCESSFUL, Segment.FAILED, Segment.UNREADABLE)


def task(alias: str, task_id: str):
    """Return one task (a task result, or an UnreadableTask); TaskResultDoesNotExist if none."""
    return get_backend(alias).peek_task(task_id)


# -- the server's memory ---------------------------------------------------------------

#: The share of `maxmemory` from which the console warns that the server is filling up.
MEMORY_WARNING_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class ServerMemory:
    """One backend's server: its address (redacted), what it runs, its memory against `maxmemory`, and its policy."""

    alias: str
    address: str
    server: str | None
    used_memory: int | None
    #: 0 or None: no limit.
    maxmemory: int | None
    #: None where INFO was denied.
    policy: str | None

    @property
    def share(self) -> float | None:
        """Used memory as a share of `maxmemory`; None without a limit or a reading."""
        if not self.maxmemory or self.used_memory is None:
            return None
        return self.used_memory / self.maxmemory

    @property
    def full(self) -> bool:
        return self.share is not None and self.share >= 1

    @property
    def level(self) -> str:
        """ "bad" for a full server, "warn" from `MEMORY_WARNING_SHARE` of `maxmemory` or an evicting policy, else "ok"."""
        if self.full:
            return "bad"
        if (self.share is not None and self.share >= MEMORY_WARNING_SHARE) or self.policy not in (None, "noeviction"):
            return "warn"
        return "ok"

    @property
    def warning(self) -> str:
        """What an operator should know, in a sentence; "" when nothing."""
        if self.full:
            return "The server is full: it refuses enqueues until workers drain it or maxmemory is raised."
        if self.share is not None and self.share >= MEMORY_WARNING_SHARE:
            return f"The server is {self.share:.0%} full: enqueues are refused at maxmemory."
        if self.policy not in (None, "noeviction"):
            return f"maxmemory-policy {self.policy} may evict tasks, results and limits: set noeviction."
        return ""


def server_memory() -> list[ServerMemory]:
    """Return the memory reading of every threadmill backend's server, in settings order (one INFO each)."""
    readings = []
    for alias in backend_aliases():
        backend = get_backend(alias)
        report = backend.preflight(fresh=True)
        readings.append(
            ServerMemory(
                alias, backend.server_address, report.server, report.used_memory, report.maxmemory, report.policy
            )
        )
    return readings
