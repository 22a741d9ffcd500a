"""django-tables2 tables over a Redis-backed `TableData`: one round trip per page, never a whole queue."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

import django_tables2 as tables
from django.core.exceptions import BadRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import mark_safe
from django_tables2.data import TableData

from threadmill import api
from threadmill.base import json_preview
from threadmill.progress import TaskProgress

from .templatetags.inspector import duration, moment, progress_bar

#: Characters of args or of a raw payload a table cell shows; the detail page shows the rest.
PREVIEW_CHARS = 120
#: Rows per page.
PER_PAGE = 50
#: What `?sort=` may be: queue order, or reversed (a segment is a sorted set; nothing else is indexed).
SORTS = ("", "enqueued_at", "-enqueued_at")


def error_line(error) -> str:
    """Return the first line of a task error's message, read off its traceback and cut to PREVIEW_CHARS."""
    path = error.exception_class_path
    names = (path, path.rpartition(".")[2])
    lines = error.traceback.rstrip().splitlines()
    # The raised exception's own line comes last but for its message's continuation lines.
    for line in reversed(lines):
        name, colon, message = line.partition(": ")
        if name in names or (not colon and line in names):
            break
    else:
        message = lines[-1] if lines else ""
    return message[:PREVIEW_CHARS] + ("…" if len(message) > PREVIEW_CHARS else "")


@dataclass(frozen=True, slots=True)
class TaskRow:
    """What a table shows of one task, read safely whether or not the payload is readable."""

    id: str
    backend: str
    task_path: str = ""
    priority: int | None = None
    args_preview: str = ""
    enqueued_at: datetime | None = None
    run_after: datetime | None = None
    worker: str = ""
    lease_started_at: datetime | None = None
    lease_deadline: datetime | None = None
    finished_at: datetime | None = None
    duration_s: float | None = None
    attempts: int | None = None
    error_class: str = ""
    #: The first line of the last error's message, cut to PREVIEW_CHARS.
    error_line: str = ""
    preview: str = ""
    read_error: str = ""
    #: Which of "gone" (the worker's heartbeat stopped) and "overdue" (the lease is past due) a running task carries.
    lease_flags: frozenset[str] = frozenset()
    #: What a running task last reported with `threadmill.set_progress`, or None.
    progress: TaskProgress | None = None

    @classmethod
    def of(cls, alias: str, item, check: api.controls.LeaseCheck | None = None) -> TaskRow:
        if isinstance(item, api.UnreadableTask):
            return cls(item.id, alias, preview=item.preview[:PREVIEW_CHARS], read_error=item.error[:PREVIEW_CHARS])
        ran = item.last_attempted_at or item.started_at
        return cls(
            id=item.id,
            backend=alias,
            task_path=item.task.module_path,
            priority=item.task.priority,
            args_preview=json_preview([item.args, item.kwargs], PREVIEW_CHARS),
            enqueued_at=item.enqueued_at,
            run_after=item.task.run_after,
            worker=getattr(item, "lease_worker", ""),
            lease_started_at=getattr(item, "lease_started_at", None),
            lease_deadline=getattr(item, "lease_deadline", None),
            finished_at=item.finished_at,
            duration_s=(item.finished_at - ran).total_seconds() if item.finished_at and ran else None,
            attempts=len(item.worker_ids),
            error_class=item.errors[-1].exception_class_path if item.errors else "",
            error_line=error_line(item.errors[-1]) if item.errors else "",
            lease_flags=frozenset(check.flags(item)) if check else frozenset(),
            progress=getattr(item, "progress", None),
        )

    @property
    def unreadable(self) -> bool:
        return not self.task_path

    @property
    def overdue(self) -> bool:
        return self.lease_deadline is not None and self.lease_deadline.timestamp() < time.time()

    @property
    def worker_gone(self) -> bool:
        return "gone" in self.lease_flags

    @property
    def css_class(self) -> str:
        if self.overdue or self.worker_gone:
            return "overdue"
        return "unreadable" if self.unreadable else ""

    @property
    def lease_age_s(self) -> float | None:
        return None if self.lease_started_at is None else max(0.0, time.time() - self.lease_started_at.timestamp())


class SegmentData(TableData):
    """One segment view as django-tables2 data: the page's rows and the total come from one `api.page` call.

    The paginator asks for the length, then for a slice; the first of them fetches the
    requested page (ordered as the table says), so both are answered by one round trip.
    """

    def __init__(
        self, alias: str, queue_name: str, segment: api.Segment, where: api.Filter, page_number: int, lease: str = ""
    ):
        super().__init__([])
        self.alias, self.queue_name, self.segment, self.where, self.lease = alias, queue_name, segment, where, lease
        self._check: api.controls.LeaseCheck | None = None
        self.offset = (page_number - 1) * PER_PAGE
        self.newest_first = api.natural_newest_first(segment)
        self._fetched: api.SegmentPage | None = None
        self._fetched_offset = -1

    #: Whether the view pages by cursor (`KeysetData`) rather than by page number.
    paged_by_cursor = False

    def _fetch(self, offset: int) -> api.SegmentPage:
        if self._fetched is None or self._fetched_offset != offset:
            if self.lease:
                found = api.controls.flagged_page(
                    self.alias, self.queue_name, self.lease, offset, PER_PAGE, self.where, self.newest_first
                )
            else:
                found = api.page(
                    self.alias, self.queue_name, self.segment, offset, PER_PAGE, self.where, self.newest_first
                )
            self._fetched, self._fetched_offset = found, offset
        return self._fetched

    @property
    def check(self) -> api.controls.LeaseCheck | None:
        """The lease check a running page's rows are flagged by, read once per page."""
        if self.segment is api.Segment.RUNNING and self._check is None:
            self._check = api.controls.lease_check(self.alias)
        return self._check

    @property
    def exact(self) -> bool:
        return self._fetch(self.offset).exact

    def __len__(self) -> int:
        return self._fetch(self.offset).total

    def __getitem__(self, key):
        if isinstance(key, slice):
            start = key.start or 0
            found = self._fetch(start)
            stop = len(found.items) if key.stop is None else key.stop - start
            return [TaskRow.of(self.alias, item, self.check) for item in found.items[:stop]]
        return self[key : key + 1][0]

    def __iter__(self):
        return iter(self[self.offset : self.offset + PER_PAGE])

    def order_by(self, aliases) -> None:
        # Only queue order can be reversed: a segment is a sorted set and nothing else is indexed.
        first = aliases[0] if aliases else ""
        natural = api.natural_newest_first(self.segment)
        self.newest_first = (not natural) if first.startswith("-") else natural

    @property
    def ordering(self):
        return None

    verbose_name = "task"
    verbose_name_plural = "tasks"


class KeysetData(SegmentData):
    """An unfiltered segment view of a partitioned alias, paged by cursor: the page after (or before) one.

    Offset paging deep into partitions merged in queue order reads every partition's head up
    to the offset; a cursor page costs one script call a partition at any depth. The page's
    rows and the segment's total come from that one `api.keyset_page` call, made on first use.
    """

    def __init__(
        self, alias: str, queue_name: str, segment: api.Segment, after: api.Cursor | None, before: api.Cursor | None
    ):
        super().__init__(alias, queue_name, segment, api.NO_FILTER, 1)
        self.after, self.before = after, before
        self._page: api.KeysetPage | None = None
        self._rows: list[TaskRow] | None = None

    paged_by_cursor = True

    @property
    def keyset(self) -> api.KeysetPage:
        if self._page is None:
            self._page = api.keyset_page(
                self.alias, self.queue_name, self.segment, after=self.after, before=self.before,
                count=PER_PAGE, newest_first=self.newest_first,
            )  # fmt: skip
        return self._page

    @property
    def exact(self) -> bool:
        return True

    @property
    def next_cursor(self) -> str:
        """The `?after=` of the next page, or "" on the last."""
        cursor = self.keyset.next_cursor
        return api.encode_cursor(cursor) if cursor else ""

    @property
    def previous_cursor(self) -> str:
        """The `?before=` of the previous page, or "" on the first."""
        cursor = self.keyset.previous_cursor
        return api.encode_cursor(cursor) if cursor else ""

    @property
    def away_from_the_head(self) -> bool:
        """Whether the page is not the segment's first: it has one before it, or it came empty from a cursor."""
        return bool(self.previous_cursor) or (not self.keyset.items and bool(self.after or self.before))

    def __len__(self) -> int:
        return self.keyset.total

    def __getitem__(self, key):
        if not isinstance(key, int | slice):
            # A template's `data.name` tries data["name"] first: answer it without a fetch.
            raise TypeError(f"rows are indexed by position, not {key!r}")
        if self._rows is None:
            self._rows = [TaskRow.of(self.alias, item, self.check) for item in self.keyset.items]
        return self._rows[key]

    def __iter__(self):
        return iter(self[:])


def select_column() -> tables.CheckBoxColumn:
    """A row's checkbox in the selection form, labelled with its task's id for screen readers."""
    row = {"name": "ids", "form": "selection", "aria-label": lambda value: f"Select task {value}"}
    return tables.CheckBoxColumn(accessor="id", attrs={"td__input": row, "th__input": {"aria-label": "Select all"}})


class SegmentTable(tables.Table):
    """Columns every segment shows."""

    select = select_column()
    id = tables.Column(verbose_name="Id", orderable=False)
    task_path = tables.Column(verbose_name="Task", orderable=False, empty_values=())
    priority = tables.Column(orderable=False)
    args_preview = tables.Column(verbose_name="Args", orderable=False)
    attempts = tables.Column(orderable=False)
    enqueued_at = tables.Column(verbose_name="Enqueued", order_by=("position",), orderable=True)

    class Meta:
        template_name = "inspector/tasks_table.html"
        per_page = PER_PAGE
        orderable = False
        empty_text = "No tasks in this segment."

    def render_id(self, value, record):
        url = reverse("inspector:task_detail", args=[record.backend, value])
        return format_html('<a href="{}" class="mono">{}</a>', url, value)

    def render_task_path(self, value, record):
        if record.unreadable:
            return mark_safe('<span class="badge bad">unreadable</span>')
        return format_html('<span class="mono">{}</span>', value)

    def render_args_preview(self, value):
        return format_html("<code>{}</code>", value)

    def render_enqueued_at(self, value):
        return moment(value)


class DeferredTable(SegmentTable):
    class Meta(SegmentTable.Meta):
        pass

    run_after = tables.Column(verbose_name="Run after", orderable=False)

    def render_run_after(self, value):
        return moment(value)


class RunningTable(SegmentTable):
    class Meta(SegmentTable.Meta):
        pass

    lease_flags = tables.Column(verbose_name="Lease", orderable=False, empty_values=())
    worker = tables.Column(orderable=False)
    lease_started_at = tables.Column(verbose_name="Lease started", orderable=False)
    lease_age_s = tables.Column(verbose_name="Lease age", orderable=False, empty_values=())
    lease_deadline = tables.Column(verbose_name="Deadline", orderable=False)
    progress = tables.Column(orderable=False, empty_values=())

    def render_progress(self, value, record):
        return progress_bar(record.id, value)

    def render_lease_flags(self, value, record):
        badges = []
        if record.worker_gone:
            badges.append(mark_safe('<span data-flag="gone" class="badge bad">worker gone</span>'))
        if record.overdue:
            badges.append(mark_safe('<span data-flag="overdue" class="badge bad">overdue</span>'))
        return mark_safe(" ".join(badges)) if badges else mark_safe('<span class="badge live">current</span>')

    def render_worker(self, value):
        return format_html('<span class="mono">{}</span>', value)

    def render_lease_started_at(self, value):
        return moment(value)

    def render_lease_age_s(self, value):
        return duration(value)

    def render_lease_deadline(self, value):
        return moment(value)


class FinishedTable(SegmentTable):
    class Meta(SegmentTable.Meta):
        pass

    finished_at = tables.Column(verbose_name="Finished", orderable=False)
    duration_s = tables.Column(verbose_name="Duration", orderable=False, empty_values=())
    error_class = tables.Column(verbose_name="Error", orderable=False)

    def render_finished_at(self, value):
        return moment(value)

    def render_duration_s(self, value):
        return duration(value)

    def render_error_class(self, value, record):
        if not record.error_line:
            return format_html('<span class="mono">{}</span>', value)
        return format_html('<span class="mono">{}</span> <span class="error-line">{}</span>', value, record.error_line)


class UnreadableTable(tables.Table):
    select = select_column()
    id = tables.Column(verbose_name="Id", orderable=False)
    preview = tables.Column(verbose_name="Raw payload (preview)", orderable=False)
    read_error = tables.Column(verbose_name="Read error", orderable=False)
    attempts = tables.Column(orderable=False, empty_values=())
    enqueued_at = tables.Column(verbose_name="Order", order_by=("position",), empty_values=(), orderable=True)

    class Meta(SegmentTable.Meta):
        pass

    render_id = SegmentTable.render_id

    def render_preview(self, value):
        return format_html("<code>{}</code>", value)

    def render_enqueued_at(self, value):
        return "—"

    def render_attempts(self, value):
        return "—"  # unknown: the payload that counts them cannot be read


TABLE_OF_SEGMENT: dict[api.Segment, type[tables.Table]] = {
    api.Segment.WAITING: SegmentTable,
    api.Segment.READY: SegmentTable,
    api.Segment.DEFERRED: DeferredTable,
    api.Segment.RUNNING: RunningTable,
    api.Segment.SUCCESSFUL: FinishedTable,
    api.Segment.FAILED: FinishedTable,
    api.Segment.UNREADABLE: UnreadableTable,
}


def segment_table(
    request, alias, queue_name, segment, where, page_number, selectable: bool, lease: str = "", keyset=None
) -> tables.Table:
    """Return the table of one segment view, ordered per the request; paged by offset, or by cursor if `keyset`.

    `keyset` is None for an offset view, else the (after, before) cursors of a cursor view.
    """
    if keyset is None:
        data = SegmentData(alias, queue_name, segment, where, page_number, lease)
    else:
        data = KeysetData(alias, queue_name, segment, *keyset)
    table = TABLE_OF_SEGMENT[segment](data, request=None, exclude=() if selectable else ("select",))
    sort = request.GET.get("sort", "")
    if sort not in SORTS:
        # django-tables2 would read anything else as a path of accessors.
        raise BadRequest(f"The sort must be enqueued_at or -enqueued_at (reversed), not {sort[:20]!r}.")
    table.order_by = sort or None
    return table
