"""Path converters that validate a console URL's backend and segment at the edge (unknown -> 404).

The ones that only check a shape are Django's `StringConverter` (the value as it is) with their own regex.
"""

from django.urls.converters import StringConverter

from threadmill import api


class BackendConverter(StringConverter):
    """A configured threadmill backend alias."""

    regex = r"[A-Za-z0-9_-]{1,100}"

    def to_python(self, value: str) -> str:
        if value not in api.backend_aliases():
            raise ValueError(f"No threadmill backend is configured as {value!r}.")
        return value


class QueueConverter(StringConverter):
    """A queue name's shape (anything but a slash); whether the queue exists needs the backend, so the view checks that."""

    regex = r"[^/]{1,200}"


class SegmentConverter:
    """One of a queue's segments."""

    regex = "|".join(segment.value for segment in api.Segment)

    def to_python(self, value: str) -> api.Segment:
        return api.Segment(value)

    def to_url(self, value: api.Segment | str) -> str:
        return api.Segment(value).value


class TaskIdConverter(StringConverter):
    """A task id's shape (a UUID, or any id a backend made, within reason)."""

    regex = r"[A-Za-z0-9_.:-]{1,100}"


class WorkerConverter(StringConverter):
    """A worker process id, "host:pid:incarnation" (an older release: "host:pid"); the view checks it is live."""

    regex = r"[^/]{1,300}"

    def to_python(self, value: str) -> str:
        if api.WorkerName.parse(value) is None:
            raise ValueError(f"{value[:40]!r} is not a worker process id.")
        return value


class WorkerCommandConverter(StringConverter):
    """What an operator can ask of a worker process."""

    regex = r"quiet|stop"


class ScheduleNameConverter(StringConverter):
    """A schedule's name (its settings entry); whether the backend has it, the view checks."""

    regex = r"[A-Za-z0-9_.-]{1,100}"


class ScheduleCommandConverter(StringConverter):
    """What an operator can do to a schedule."""

    regex = r"pause|resume|run"


class TaskPathConverter(StringConverter):
    """A task path's shape: a dotted Python path (`<locals>` allowed), or "(other)" for the paths past the cap."""

    regex = r"\(other\)|[A-Za-z_][A-Za-z0-9_.<>]{0,199}"
