"""The layout version of an alias's stored data: which keys and fields hold what.

Version 1 is every release before the version was stored: a finished task's result in its
own key (`threadmill:{<alias>}:result:<id>`). Version 2 keeps the result in the task hash;
its readers still read a version 1 result key until it expires, so going from 1 to 2 moves
no data, it only records 2. An alias that has no version is new or was written by version 1
code, and both are recorded as 2. Version 3 is version 2 with `partitions` above 1 used at
least once: task ids that name their partition and keys per partition (see
`threadmill.backends.partitions`); code that knows only 2 must refuse it, so an alias is
stamped 3 the first time a process starts with more than one partition, and stays 3.

One command decides: `SET <layout key> <ours> NX GET` records this code's version where none
is stored and returns any stored one, atomically, so two processes starting at once agree
(`NX` with `GET` needs Redis 7.0 or later, or any Valkey). A
stored version this code migrates from is then overwritten with a plain SET (no release
stores 1, so only an operator's hand puts it there). A newer or unknown one is refused.
A full server (maxmemory, noeviction) refuses that SET: the stored version is then read
with a GET, on that refusal only, and an unpartitioned alias with none is left unrecorded.
"""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from ..exceptions import LayoutVersionError

#: The layout an alias that never used more than one partition is recorded as.
UNPARTITIONED_LAYOUT = 2
#: The layout of an alias that used `partitions` > 1 at least once.
PARTITIONED_LAYOUT = 3
#: The newest layout this code knows (reads and writes).
CURRENT_LAYOUT = PARTITIONED_LAYOUT
#: Every layout this code reads as it is; an older one is only re-recorded.
READABLE_LAYOUTS = frozenset({1, UNPARTITIONED_LAYOUT, PARTITIONED_LAYOUT})

# Raise the alias's highest partition count to ARGV[1] (never lower it); return the result.
# allow-oom: a worker start with more partitions raises it, and a full server must still take it.
_RAISE_PARTITIONS_SEEN = """#!lua flags=allow-oom
local seen = tonumber(redis.call('GET', KEYS[1]) or '1') or 1
local wanted = tonumber(ARGV[1])
if wanted > seen then
  redis.call('SET', KEYS[1], wanted)
  return wanted
end
return seen
"""


def check_layout(client: redis.Redis | RedisCluster, key: str, alias: str, *, partitioned: bool = False) -> int | None:
    """Record this code's layout at `key` unless one is stored; return the one found (None for none).

    `partitioned` asks for PARTITIONED_LAYOUT (the alias runs with more than one partition);
    an older stored layout is raised to the one asked for, a newer known one is kept.

    Raises:
        LayoutVersionError: the stored version is newer than this code's or not a version at all.
    """
    wanted = PARTITIONED_LAYOUT if partitioned else UNPARTITIONED_LAYOUT
    try:
        stored = client.set(key, wanted, nx=True, get=True)
    except redis.exceptions.OutOfMemoryError:
        # A full server refuses any SET, even one that would keep the stored value: read it
        # instead, so workers and commands still start on a full server and drain it. With none
        # stored, layout 2 is what this code reads anyway: it is recorded by a later start.
        stored = client.get(key)
        if stored is None and not partitioned:
            return None
        if stored is None:
            raise
    if stored is None:
        return None
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    version = int(text) if text.isdigit() else None
    if version not in READABLE_LAYOUTS:
        raise LayoutVersionError(_refusal(alias, key, text))
    if version < wanted:
        client.set(key, wanted)
    return version


def record_partitions(client: redis.Redis | RedisCluster, key: str, partitions: int) -> int:
    """Raise the alias's highest partition count to `partitions` if lower; return the count now stored.

    Workers and brokers cover every partition below it, so lowering `partitions` strands nothing.
    """
    if partitions <= 1:
        stored = client.get(key)
        return int(stored) if stored and stored.isdigit() else 1
    return int(client.eval(_RAISE_PARTITIONS_SEEN, 1, key, partitions))


def _refusal(alias: str, key: str, stored: str) -> str:
    return (
        f"The data of task backend {alias!r} has layout version {stored}, and this Threadmill knows layouts up "
        f"to {CURRENT_LAYOUT}. Upgrade Threadmill on every host to a release that knows layout {stored}; or, "
        f"to go back to this release, drain the alias with the release that wrote it and delete the key {key}, "
        f"so this release records its own layout again."
    )
