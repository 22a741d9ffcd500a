"""What every tooling mixin uses of the backend it is mixed into, and the two helpers they share.

The mixins hold no state of their own: `RedisTaskBackend` sets these attributes, and
`PartitionRouting`, mixed in beside them, routes a call to a partition's keys and scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster

if TYPE_CHECKING:
    import redis

    from ...schedules import Schedule
    from ..keys import KeySchema
    from ..options import BackendOptions
    from ..scripts import RedisScripts


class ToolingHost:
    """The backend's attributes and partition routing, as the tooling mixins read them."""

    keys: KeySchema
    config: BackendOptions
    schedules: tuple[Schedule, ...]
    queues: set[str]
    cluster: bool
    # From PartitionRouting (mixed in beside the tooling).
    keys_for: Any
    scripts_for: Any
    task_keys: Any
    task_scripts: Any
    covered_partitions: Any
    # From WorkflowBackend: continues a release of workflow children a script cut short at its budget.
    finish_settling: Any

    if TYPE_CHECKING:
        # A property of the backend: the cluster client with CLUSTER.
        @property
        def client(self) -> redis.Redis | RedisCluster: ...

        @property
        def scripts(self) -> RedisScripts: ...

    def _partition_scripts(self) -> list[RedisScripts]:
        """The scripts of every covered partition, partition 0 first."""
        return [self.scripts_for(partition) for partition in self.covered_partitions()]

    def client_for(self, key: str) -> redis.Redis:
        """Return a plain client on the node holding `key`: the one server, or the primary owning its slot.

        For commands a cluster client will not route by key, such as TIME in a pipeline: every
        decision about leases and heartbeats uses the clock of the node that holds them.
        """
        client = self.client
        if not isinstance(client, RedisCluster):
            return client
        return client.get_redis_connection(client.get_node_from_key(key))
