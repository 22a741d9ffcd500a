"""The layout version of an alias's stored data: which keys and fields hold what.

Version 1 is every release before the version was stored: a finished task's result in its
own key (`threadmill:{<alias>}:result:<id>`). Version 2 keeps the result in the task hash;
its readers still read a version 1 result key until it expires, so going from 1 to 2 moves
no data, it only records 2. An alias that has no version is new or was written by version 1
code, and both are recorded as 2.

One command decides: `SET <layout key> <ours> NX GET` records this code's version where none
is stored and returns any stored one, atomically, so two processes starting at once agree
(`NX` with `GET` needs Redis 7.0 or later, or any Valkey). A
stored version this code migrates from is then overwritten with a plain SET (no release
stores 1, so only an operator's hand puts it there). A newer or unknown one is refused.
"""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from ..exceptions import LayoutVersionError

#: The layout version this code writes.
CURRENT_LAYOUT = 2
#: Older layouts this code reads as they are, so migrating one only records CURRENT_LAYOUT.
READABLE_LAYOUTS = frozenset({1})


def check_layout(client: redis.Redis | RedisCluster, key: str, alias: str) -> int | None:
    """Record CURRENT_LAYOUT at `key` unless a version is stored; return the one found (None for none).

    Raises:
        LayoutVersionError: the stored version is newer than this code's or not a version at all.
    """
    stored = client.set(key, CURRENT_LAYOUT, nx=True, get=True)
    if stored is None:
        return None
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    version = int(text) if text.isdigit() else None
    if version == CURRENT_LAYOUT:
        return version
    if version in READABLE_LAYOUTS:
        client.set(key, CURRENT_LAYOUT)
        return version
    raise LayoutVersionError(_refusal(alias, key, text))


def _refusal(alias: str, key: str, stored: str) -> str:
    return (
        f"The data of task backend {alias!r} has layout version {stored}, and this Threadmill knows layouts up "
        f"to {CURRENT_LAYOUT}. Upgrade Threadmill on every host to a release that knows layout {stored}; or, "
        f"to go back to this release, drain the alias with the release that wrote it and delete the key {key}, "
        f"so this release records layout {CURRENT_LAYOUT} again."
    )
