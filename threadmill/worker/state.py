"""What the threads of one worker process share besides their lock: its phase and its buffered tasks."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..base import ThreadmillTaskResult


class Phase(enum.Enum):
    """Where a worker process is in its life; see the module docstring for the transitions."""

    FETCHING = "fetching"
    QUIET = "quiet"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(slots=True)
class Buffered:
    """A leased task waiting for a consumer, the monotonic time its lease may have run out by, and its trust epoch."""

    result: ThreadmillTaskResult
    expires: float
    epoch: int
    #: Server-clock epoch seconds minus this process's monotonic clock, as of the acquire call.
    clock_offset: float = 0.0
