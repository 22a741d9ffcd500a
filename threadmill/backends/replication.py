"""`wait_replicas`: an enqueue returns only once that many replicas confirmed they have its write.

`WAIT n timeout` counts the replicas that confirmed every write of its own connection, so
it goes on the connection the enqueue script ran on: the thread's one connection on a single
server, the thread's connection to the primary owning the alias's slot on a cluster. It is a
second round trip after the script, as `fsync_enqueue`'s `WAITAOF` is.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from ..exceptions import ReplicaWaitError
from .errors import translate_errors
from .scripts import RedisScripts

NAMED_IDS = 3


def named_ids(task_ids: Sequence[str]) -> str:
    """The first `NAMED_IDS` ids, then how many more: a 10,000-task workflow's error stays one line."""
    named = ", ".join(task_ids[:NAMED_IDS])
    rest = len(task_ids) - NAMED_IDS
    return f"{named} and {rest:,} more" if rest > 0 else named


@translate_errors
def wait_for_replicas(scripts: RedisScripts, key: str, replicas: int, within_s: float, task_ids: Sequence[str]) -> None:
    """Return once `replicas` replicas confirmed this thread's writes to `key`'s node; ReplicaWaitError otherwise."""
    # The same lookup the script call made: after a MOVED it names the new owner, which ran it.
    connection = scripts.connection_for(key)
    try:
        connection.send_command("WAIT", replicas, max(1, round(within_s * 1000)))
        confirmed = int(connection.read_response())
    except (redis.ConnectionError, redis.TimeoutError):
        connection.disconnect()
        raise
    if confirmed < replicas:
        raise ReplicaWaitError(
            f"Task(s) {named_ids(task_ids)} are stored, but {confirmed} of the {replicas} replica(s) "
            f"wait_replicas asks for confirmed them within {within_s:g} s: they may be lost if the primary "
            "fails now. Give the primary that many replicas (INFO replication lists them) or lower wait_replicas."
        )
