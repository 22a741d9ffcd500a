"""The Redis key schema: the one module that builds key and channel names.

Every key of a backend alias shares the Cluster hash tag `threadmill:{<alias>}`, so
each Lua script touches one shard. With `partitions` P > 1, partition p >= 1 has keys of
its own under `threadmill:{<alias>/<p>.<n>}` (partition 0 keeps the alias's), so the
partitions spread over a cluster's shards. The data model page (docs/reference/data-model.md) shows the layout.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from redis.crc import key_slot

from ..base import Segment

#: The ACL rules of a Redis user that runs Threadmill's producers, workers, broker, operator commands
#: and console and nothing else: every key and channel under `threadmill:`, reads, writes, scripts,
#: pub/sub, the connection's own commands, TIME and INFO (the preflight), and no other dangerous
#: command (no CONFIG, KEYS, SCAN, CLIENT KILL, FLUSHALL). `ACL SETUSER <name> on ><password> <rules>`.
ACL_RULES = (
    "~threadmill:* &threadmill:* -@all +@read +@write +@scripting +@pubsub +@connection +@transaction "
    "+time -@dangerous +info"
)

#: Ready score band width: score = (100 - priority) * band + enqueue milliseconds.
PRIORITY_BAND = 10**13


def ready_score(priority: int, now: float) -> str:
    """Return the ready-segment score of a task of `priority` enqueued at `now` (epoch seconds)."""
    return f"{(100 - priority) * PRIORITY_BAND + int(now * 1000)}"


#: The task hash fields a read of one task fetches, in this order.
TASK_FIELDS = (
    "data",
    "queue",
    "segment",
    "started_at",
    "lease_worker",
    "lease_started_at",
    "lease_token",
    "read_error",
    "result",
    "reported_progress",
    "metadata",
    "attempts",
    "unique",
    "upstream_failed",
)
#: Seconds a per-minute counter outlives its minute: the console charts the last 24 hours.
#: Each queue keeps at most 4 counters a minute (in, out, failed, latency), about 5,800 keys.
THROUGHPUT_COUNTER_TTL_S = 25 * 60 * 60
#: The per-minute counters of a queue, in the order history reads them.
THROUGHPUT_SERIES = ("ingress", "egress", "failed", "latency")
#: Minutes in a quarter-hour, the 24-hour chart's bucket; a closed one is summarised into one key (96 a day).
QUARTER_MINUTES = 15


#: Hash slots of a Redis or Valkey Cluster.
SLOT_COUNT = 16384
#: How far (in slots) a partition's tag may land from the slot aimed at.
_SLOT_TOLERANCE = 8


def _spread(partition: int) -> float:
    """Return where partition p aims in the slot space, as a fraction past partition 0's slot.

    The digits of p in the mixed radix (3, 2, 2, ...) read backwards: 0, 1/3, 2/3, 1/6, 1/2,
    5/6, 1/12, ... so the first 3 x 2^k partitions sit evenly spaced, whatever P is: three
    equal shards carry P/3 partitions each when P is 3, 6, 12... (a plain `alias/p` tag lands
    where its hash falls: 6 partitions over 3 shards measured 1, 3 and 2).
    """
    fraction, scale, radix = 0.0, 1.0, 3
    while partition:
        partition, digit = divmod(partition, radix)
        scale /= radix
        fraction += digit * scale
        radix = 2
    return fraction


@functools.cache
def partition_tag(alias: str, partition: int) -> str:
    """Return the hash tag of one partition of an alias: the alias for 0, else `<alias>/<p>.<n>`.

    n is the first number whose tag's slot is within a few slots of the one partition p aims
    at (`_spread`), found by trying n = 0, 1, ... (about a thousand CRC16s, once per process).
    The tag depends on the alias and p only, never on P, so changing P moves no task.
    """
    if partition == 0:
        return alias
    target = (key_slot(alias.encode()) + round(_spread(partition) * SLOT_COUNT)) % SLOT_COUNT
    for n in itertools.count():
        tag = f"{alias}/{partition}.{n}"
        distance = abs(key_slot(tag.encode()) - target)
        if min(distance, SLOT_COUNT - distance) <= _SLOT_TOLERANCE:
            return tag
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class KeySchema:
    """Builds every key and channel name of one partition of a backend alias (partition 0 by default).

    Alias-wide keys (workers, heartbeats, control, schedules, layout) are read from
    partition 0's schema; the other partitions' copies of them exist only as script keys
    that must share the partition's hash tag.
    """

    alias: str
    partition: int = 0
    prefix: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", f"threadmill:{{{partition_tag(self.alias, self.partition)}}}")

    def task(self, task_id: str) -> str:
        """Hash: `data`, `queue`, `segment`, `score`, `started_at` and the lease fields."""
        return f"{self.prefix}:task:{task_id}"

    @staticmethod
    def task_id_of(key: str) -> str | None:
        """Return the task id of a task hash's key (any partition's), None for another key."""
        _, found, task_id = key.rpartition(":task:")
        return task_id if found and task_id else None

    def result(self, task_id: str) -> str:
        """String: the finished task's document, expiring after `result_ttl`."""
        return f"{self.prefix}:result:{task_id}"

    def segment(self, queue_name: str, segment: Segment | str) -> str:
        """Sorted set of task ids in one segment of a queue."""
        return f"{self.prefix}:{queue_name}:{segment}"

    def unique(self, digest: str) -> str:
        """String: the id of the task holding one uniqueness key (`threadmill.unique`)."""
        return f"{self.prefix}:unique:{digest}"

    def wake(self, queue_name: str) -> str:
        """List holding at most one token: pushed when tasks become ready, popped (BLPOP) by an idle worker."""
        return f"{self.prefix}:{queue_name}:wake"

    def worker_wake(self, name: str) -> str:
        """List an idle worker process also waits on, so it can be woken to stop."""
        return f"{self.prefix}:worker:{name}:wake"

    def schedules(self) -> str:
        """Hash of schedule state: `<name>:tick` (last enqueued tick), `:cron` (its cron and zone), `:task`,
        `:enqueued_at`, `:paused`."""
        return f"{self.prefix}:schedules"

    def trimmed(self) -> str:
        """Sorted set of the successful tasks a full server's trimmer dropped: task id -> finish time."""
        return f"{self.prefix}:trimmed"

    def control(self) -> str:
        """Hash of operators' pending commands: worker name -> JSON {"command", "by", "at"}."""
        return f"{self.prefix}:control"

    def paused(self) -> str:
        """Hash of paused queues: queue name -> JSON {"by": who, "since": server epoch seconds}."""
        return f"{self.prefix}:paused"

    def limits(self) -> str:
        """Hash of runtime limits: queue name -> "concurrency|rate count|rate period s" (empty: the setting's),
        and `<queue>:set` -> JSON {"by": who, "since": server epoch seconds}."""
        return f"{self.prefix}:limits"

    def throttled(self) -> str:
        """Hash of queues whose ready tasks acquire held back at their concurrency limit: queue name -> "1"."""
        return f"{self.prefix}:throttled"

    def lease_times(self, queue_name: str) -> str:
        """List of a rate-limited queue's last lease times, newest first (server epoch seconds): its rate's tokens."""
        return f"{self.prefix}:{queue_name}:lease-times"

    def task_limits(self) -> str:
        """Hash of per-task limits: task path -> "concurrency|rate count|rate period s" (`@task(concurrency=, rate=)`)."""
        return f"{self.prefix}:task-limits"

    def limited_queues(self) -> str:
        """Hash of queues that have held a task with a per-task limit: queue name -> "1" (acquire looks at paths there)."""
        return f"{self.prefix}:limited-queues"

    def task_limit_prefix(self) -> str:
        """Prefix of a limited task path's keys: `<prefix><path>:running` (set of its leased task ids) and
        `<prefix><path>:lease-times` (its rate's tokens, as a queue's)."""
        return f"{self.prefix}:task-limit:"

    def queues(self) -> str:
        """Set of every queue name a task was ever enqueued on."""
        return f"{self.prefix}:queues"

    def throughput(self, queue_name: str, direction: str, minute: int) -> str:
        """Per-minute counter of a queue: tasks in (`ingress`), out (`egress`), `failed`, or the oldest ready age (`latency`, ms)."""
        return f"{self.prefix}:{queue_name}:{direction}:{minute}"

    def quarter(self, queue_name: str, first_minute: int) -> str:
        """Summary of a closed quarter-hour of a queue's per-minute counters, "in,out,failed,latency_ms", by its first minute."""
        return f"{self.prefix}:{queue_name}:quarter:{first_minute}"

    def workers(self) -> str:
        """Sorted set of worker names (`host:pid:incarnation`) by their last heartbeat, server seconds."""
        return f"{self.prefix}:workers"

    def worker(self, name: str) -> str:
        """String: a worker process's last heartbeat document (JSON), expiring with it."""
        return f"{self.prefix}:worker:{name}"

    def throughput_prefix(self, queue_name: str, direction: str) -> str:
        """The prefix a script appends the server's minute to, for a per-minute counter."""
        return f"{self.prefix}:{queue_name}:{direction}:"

    def totals(self, queue_name: str) -> str:
        """Hash of a queue's monotonic counters since it was first used (`tooling.metrics.TOTALS`)."""
        return f"{self.prefix}:{queue_name}:totals"

    def task_stats(self, queue_name: str, period: str) -> str:
        """Hash of a queue's per-task-path counts (`threadmill.backends.taskstats`) of one period:
        `m<minute>` or `h<hour>` (server epoch minutes or hours), or `total` since first use."""
        return f"{self.prefix}:{queue_name}:taskstats:{period}"

    def task_paths(self, queue_name: str) -> str:
        """Set of the task paths a queue's per-task counts name (at most `taskstats.PATH_CAP`)."""
        return f"{self.prefix}:{queue_name}:taskpaths"

    def telemetry(self) -> str:
        """Pub/sub channel of ingress, egress and worker snapshot events."""
        return f"{self.prefix}:telemetry"

    def partitions_seen(self) -> str:
        """String: the highest `partitions` setting any process used on this alias (absent: 1)."""
        return f"{self.prefix}:partitions"

    def layout(self) -> str:
        """String: the layout version of the alias's data (threadmill.backends.layout.CURRENT_LAYOUT)."""
        return f"{self.prefix}:layout"

    def workflow(self, workflow_id: str) -> str:
        """Hash of a workflow (`threadmill.workflows`): `name`, `created_at`, `graph` (JSON of its nodes), `total`
        and the counts its scripts keep, `waiting`, `successful`, `failed`."""
        return f"{self.prefix}:workflow:{workflow_id}"

    def workflows(self) -> str:
        """Sorted set of workflow ids by their enqueue time, server epoch seconds."""
        return f"{self.prefix}:workflows"

    def workflow_children(self, task_id: str) -> str:
        """Set of the ids of a workflow task's children, deleted when the task is final and has released them."""
        return f"{self.prefix}:children:{task_id}"

    def workflow_pending(self, task_id: str) -> str:
        """Set of the ids of a waiting task's parents that are not final yet; empty (so gone) once it is released."""
        return f"{self.prefix}:pending:{task_id}"

    def workflow_settling(self) -> str:
        """List of final workflow tasks whose release of children a script call cut short at its budget, oldest first."""
        return f"{self.prefix}:settling"

    def task_prefix(self) -> str:
        """The prefix the Lua scripts append a task id to."""
        return f"{self.prefix}:task:"

    def result_prefix(self) -> str:
        """The prefix the Lua scripts append a task id to for its result."""
        return f"{self.prefix}:result:"
