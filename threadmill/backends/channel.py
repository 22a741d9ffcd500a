"""The telemetry channel's client side: classic pub/sub on one server, sharded pub/sub on a cluster.

On a cluster a classic PUBLISH goes to every node over the cluster bus; a sharded one
(SPUBLISH) stays on the shard that owns the channel's slot, which is the slot of the alias's
keys (the channel carries their hash tag). The scripts publish the same way, by their flag.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.cluster import RedisCluster


def publish(client: redis.Redis | RedisCluster, channel: str, text: str, *, sharded: bool) -> None:
    """Publish `text` on `channel`: SPUBLISH when `sharded`, else PUBLISH."""
    if sharded:
        client.spublish(channel, text)
    else:
        client.publish(channel, text)


class TelemetrySubscription:
    """One subscription to some telemetry channels of one server or cluster."""

    def __init__(self, client: redis.Redis | RedisCluster, channels: Sequence[str], *, sharded: bool) -> None:
        self.sharded = sharded
        self._pubsub = client.pubsub(ignore_subscribe_messages=True)
        if sharded:
            # Each channel is subscribed on the node owning its slot, one connection per node.
            self._pubsub.ssubscribe(*channels)
        else:
            self._pubsub.subscribe(*channels)

    def next_message(self, timeout: float) -> tuple[str, bytes] | None:
        """Return the next (channel, payload) within `timeout` seconds, or None."""
        if self.sharded:
            message = self._pubsub.get_sharded_message(timeout=timeout)
            kind = "smessage"
        else:
            message = self._pubsub.get_message(timeout=timeout)
            kind = "message"
        if not message or message["type"] not in (kind, kind.encode()):
            return None
        return message["channel"].decode(), message["data"]

    def close(self) -> None:
        self._pubsub.close()
