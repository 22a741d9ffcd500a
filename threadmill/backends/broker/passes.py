"""One broker pass: the queues and partitions it serves, the servers it could not reach, and `Duty`.

A pass opens by reading, on partition 0, the partitions to cover and the queues; each duty
then does its part through `BrokerPass.attempt`. With several partitions on a cluster, a pass that cannot reach one partition's primary skips
the partitions on that node for the rest of the pass and serves the others; it raises the
first error at its end, so the caller still sees the outage (`RedisBroker.failed_partitions`
says which).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ...exceptions import ServerUnreachable

if TYPE_CHECKING:
    from ..redis import RedisTaskBackend


class PassFailures:
    """The servers one broker pass could not reach, each with its first error.

    A duty that fails marks its partition's server failed: the pass skips that server's other
    partitions (each call there would wait out `socket_timeout` again) and serves the rest.
    """

    def __init__(self, backend: RedisTaskBackend) -> None:
        self.backend = backend
        self._errors: dict[str, Exception] = {}

    def attempt(self, partition: int, duty: Callable[..., Any], *args: Any) -> Any:
        """Return `duty(*args)`, or None when it fails or its partition's server already failed this pass."""
        server = self._server(partition)
        if server in self._errors:
            return None
        try:
            return duty(*args)
        except Exception as e:  # noqa: BLE001 - raised by raise_first once the other partitions are served
            self._errors[server] = e
            return None

    def reached(self, partition: int) -> bool:
        """Whether every call of this pass to the partition's server succeeded."""
        return self._server(partition) not in self._errors

    def raise_first(self, partitions: range) -> None:
        """Raise the first error of the pass, if any; an outage that cost only some of `partitions` names them."""
        for error in self._errors.values():
            skipped = [p for p in partitions if not self.reached(p)]
            if isinstance(error, ServerUnreachable) and len(skipped) < len(partitions):
                raise ServerUnreachable(
                    f"{error}; the pass skipped partition(s) {', '.join(map(str, skipped))} of {len(partitions)} "
                    "and served the others."
                ) from error
            raise error

    def _server(self, partition: int) -> str:
        try:
            return self.backend.scripts_for(partition).server_name()
        except Exception:  # noqa: BLE001 - no node owns the partition's slot now (a failover): its own
            return f"partition {partition}"


@dataclass
class BrokerPass:
    """One walk of the broker's duties over some queues in some partitions."""

    queue_names: list[str]
    partitions: range
    failures: PassFailures
    #: Whether the broker has reached partition 0 long enough for an old heartbeat to mean a gone worker.
    trusts_heartbeats: bool = False

    def attempt(self, partition: int, call: Callable[..., Any], *args: Any) -> Any:
        """Return `call(*args)`, or None when it fails or the partition's server already failed this pass."""
        return self.failures.attempt(partition, call, *args)

    def reached(self, partition: int) -> bool:
        """Whether every call of this pass to the partition's server succeeded."""
        return self.failures.reached(partition)

    def each(self) -> Iterator[tuple[str, int]]:
        """Yield every (queue name, partition) this pass serves, queue by queue."""
        for queue_name in self.queue_names:
            for partition in self.partitions:
                yield queue_name, partition

    def serve_each(self, call: Callable[[str, int], int | None]) -> int:
        """Attempt `call(queue_name, partition)` for each queue in each partition; return the sum of what it returned."""
        return sum(self.attempt(partition, call, queue_name, partition) or 0 for queue_name, partition in self.each())


class Duty:
    """One periodic job of the broker; a subclass named in `DUTIES` runs in every pass it is due in."""

    #: The duty's name, unique in the registry.
    name: ClassVar[str]
    #: Whether the broker's first pass runs it; False: its first run falls due one `interval()` after the broker starts.
    runs_at_start: ClassVar[bool] = True

    def __init__(self, backend: RedisTaskBackend) -> None:
        self.backend = backend

    def interval(self) -> float:
        """Return the least time between two runs, seconds: a pass that comes sooner leaves the duty out."""
        return self.backend.config.broker_interval

    def run_once(self, pass_: BrokerPass) -> int:
        """Do the duty's work for the pass, each server call through `pass_.attempt`; return how many tasks it handled."""
        raise NotImplementedError
