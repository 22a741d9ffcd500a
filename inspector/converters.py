"""Path converters that validate a console URL's backend and segment at the edge (unknown -> 404)."""

from threadmill import api


class BackendConverter:
    """A configured threadmill backend alias."""

    regex = r"[A-Za-z0-9_-]{1,100}"

    def to_python(self, value: str) -> str:
        if value not in api.backend_aliases():
            raise ValueError(f"No threadmill backend is configured as {value!r}.")
        return value

    def to_url(self, value: str) -> str:
        return value


class QueueConverter:
    """A queue name's shape (anything but a slash); whether the queue exists needs the backend, so the view checks that."""

    regex = r"[^/]{1,200}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class SegmentConverter:
    """One of a queue's segments."""

    regex = r"ready|deferred|running|successful|failed|unreadable"

    def to_python(self, value: str) -> api.Segment:
        return api.Segment(value)

    def to_url(self, value: api.Segment | str) -> str:
        return api.Segment(value).value


class TaskIdConverter:
    """A task id's shape (a UUID, or any id a backend made, within reason)."""

    regex = r"[A-Za-z0-9_.:-]{1,100}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class WorkerConverter:
    """A worker process id, "host:pid:incarnation" (an older release: "host:pid"); the view checks it is live."""

    regex = r"[^/]{1,300}"

    def to_python(self, value: str) -> str:
        if api.WorkerName.parse(value) is None:
            raise ValueError(f"{value[:40]!r} is not a worker process id.")
        return value

    def to_url(self, value: str) -> str:
        return value


class WorkerCommandConverter:
    """What an operator can ask of a worker process."""

    regex = r"quiet|stop"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class ScheduleNameConverter:
    """A schedule's name (its settings entry); whether the backend has it, the view checks."""

    regex = r"[A-Za-z0-9_.-]{1,100}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class ScheduleCommandConverter:
    """What an operator can do to a schedule."""

    regex = r"pause|resume|run"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class TaskPathConverter:
    """A task path's shape: a dotted Python path (`<locals>` allowed), or "(other)" for the paths past the cap."""

    regex = r"\(other\)|[A-Za-z_][A-Za-z0-9_.<>]{0,199}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value
