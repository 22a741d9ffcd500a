"""Which partition a task lives in, read from its id alone.

With `partitions` P > 1 a task id is a UUIDv8 laid out like a UUIDv7 (millisecond time
first) whose last byte is its partition. Any other id (a UUIDv7 from P = 1, or a caller's)
lives in partition 0, so P can change while tasks wait and no lookup is ever needed.
"""

from __future__ import annotations

_HEX = frozenset("0123456789abcdef")


def partition_of(task_id: str) -> int:
    """Return the partition of a task id: the last byte of a UUIDv8, else 0."""
    if names_partition(task_id):
        return int(task_id[-2:], 16)
    return 0


def names_partition(task_id: str) -> bool:
    """Whether a task id names its partition (a UUIDv8 of `partitions` > 1), not a UUIDv7 or a caller's id."""
    return len(task_id) == 36 and task_id[14] == "8" and task_id[-2] in _HEX and task_id[-1] in _HEX


def by_partition(items, task_id_of) -> dict[int, list]:
    """Group `items` by the partition of `task_id_of(item)`, keeping their order within each group."""
    groups: dict[int, list] = {}
    for item in items:
        groups.setdefault(partition_of(task_id_of(item)), []).append(item)
    return groups
