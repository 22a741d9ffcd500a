"""A workflow's enqueue is as durable as a plain enqueue: retried through a lost reply and a kill -9, all or nothing.

The connection is really cut (the TCP proxy resets it, or the server is killed -9); what the
server holds afterwards is read from it and compared with what the calls returned.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Self
from urllib.parse import urlsplit

import pytest
import redis
from django.tasks import task_backends

from tests import tasks
from tests.faults.conftest import QUEUES, FaultServer, wait_for
from tests.faults.proxy import Proxy
from threadmill.base import Segment
from threadmill.embedded import free_port
from threadmill.exceptions import ServerUnreachable
from threadmill.workflows import Workflow, WorkflowResult

#: The fan-in's parents: with the join, each workflow holds PARENTS + 1 tasks.
PARENTS = 4


def fan_in() -> Workflow:
    """A workflow of `PARENTS` parents and one join waiting on them all."""
    wf = Workflow()
    parents = [wf.add(tasks.echo, (i,)) for i in range(PARENTS)]
    wf.add(tasks.echo, ("join",), after=parents, name="join")
    return wf


class Stored:
    """What the server holds of the default backend's workflows, read from it."""

    def __init__(self, url: str) -> None:
        self.backend = task_backends["default"]
        self.client = redis.Redis.from_url(url)

    def workflow_ids(self) -> list[str]:
        return [member.decode() for member in self.client.zrange(self.backend.keys.workflows(), 0, -1)]

    def task_hashes(self) -> int:
        match = self.backend.keys.task_prefix() + "*"
        return sum(1 for _ in self.client.scan_iter(match=match, count=1000))

    def segment(self, segment: Segment) -> list[str]:
        key = self.backend.keys.segment("default", segment)
        return [member.decode() for member in self.client.zrange(key, 0, -1)]

    def totals(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.backend.keys.totals("default")).items()}

    def assert_whole(self, run: WorkflowResult) -> None:
        """Assert every task of `run` is stored once, the parents ready and the join waiting."""
        parents = [r.id for name, r in run.tasks.items() if name != "join"]
        assert sorted(p for p in self.segment(Segment.READY) if p in parents) == sorted(parents)
        assert self.segment(Segment.WAITING).count(run.tasks["join"].id) == 1
        assert self.backend.get_workflow(run.id).counts["WAITING"] == 1


@pytest.fixture
def point_default(settings) -> Callable[..., Stored]:
    """Point this process's `default` backend at `url` with `options`; return a reader of that server."""

    def point(url: str, **options: float) -> Stored:
        settings.TASKS = {
            "default": {
                **settings.TASKS["default"],
                "REDIS_URL": url,
                "QUEUES": QUEUES,
                "OPTIONS": {"lease_ttl": 60, "socket_timeout": 1, **options},
            }
        }
        return Stored(url)

    return point


@pytest.fixture
def proxy(fault_server) -> Iterator[Proxy]:
    with Proxy(urlsplit(fault_server.url).port) as running:
        yield running


@pytest.mark.parametrize("fsync_enqueue", [False, True])
def test_a_workflow_whose_reply_was_lost_is_retried_and_stored_once(proxy, point_default, fsync_enqueue):
    stored = point_default(proxy.url, fsync_enqueue=fsync_enqueue)
    first = fan_in().enqueue()  # connects (and checks the append-only file) before the fault
    proxy.lose_replies(1)
    run = fan_in().enqueue()
    assert sorted(stored.workflow_ids()) == sorted([first.id, run.id])
    assert stored.task_hashes() == 2 * (PARENTS + 1)
    stored.assert_whole(run)
    totals = stored.totals()
    assert (totals["enqueued"], totals["enqueue_retries"], totals["already_stored"]) == (
        2 * (PARENTS + 1),
        1,
        PARENTS + 1,
    )


def test_a_workflow_aenqueue_whose_reply_was_lost_is_retried_and_stored_once(proxy, point_default):
    stored = point_default(proxy.url)

    async def enqueue_twice() -> WorkflowResult:
        await fan_in().aenqueue()  # connects the thread aenqueue runs in before the fault
        proxy.lose_replies(1)
        return await fan_in().aenqueue()

    run = asyncio.run(enqueue_twice())
    assert len(stored.workflow_ids()) == 2 and run.id in stored.workflow_ids()
    assert stored.task_hashes() == 2 * (PARENTS + 1)
    stored.assert_whole(run)
    assert stored.totals()["enqueue_retries"] == 1


def test_a_workflow_enqueue_that_gives_up_stores_nothing_and_names_its_budget(fault_server, proxy, point_default):
    stored = point_default(proxy.url, enqueue_retry=0.5)
    fan_in().enqueue()
    proxy.point_at(free_port())  # nothing listens there: every new connection is refused
    proxy.reset()
    wf = fan_in()
    with pytest.raises(ServerUnreachable, match=r"gave up after trying for .* enqueue_retry is 0\.5 s"):
        wf.enqueue()
    proxy.point_at(urlsplit(fault_server.url).port)
    assert len(stored.workflow_ids()) == 1
    assert stored.task_hashes() == PARENTS + 1
    assert stored.totals()["enqueued"] == PARENTS + 1


class WorkflowLoad:
    """Two threads enqueueing fan-ins until stopped; each call's workflow id or error kept."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.returned: list[str] = []
        self.raised: list[Exception] = []
        self.threads = [threading.Thread(target=self._loop, name=f"workflows-{i}") for i in range(2)]

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            try:
                run = fan_in().enqueue()
            except ServerUnreachable as e:
                with self.lock:
                    self.raised.append(e)
            else:
                with self.lock:
                    self.returned.append(run.id)

    def more_than(self, count: int) -> Callable[[], bool]:
        return lambda: len(self.returned) > count


def test_workflows_ride_out_a_kill_and_restart_each_stored_once_and_whole(make_fault_server, point_default):
    # appendfsync always: a kill -9 keeps every write the server answered, so each returned workflow must be there.
    server: FaultServer = make_fault_server("always")
    stored = point_default(server.url)
    with WorkflowLoad() as load:
        for _ in range(2):
            wait_for(load.more_than(len(load.returned) + 20), lambda: "the load enqueues workflows", 10)
            server.kill9_and_restart()
        wait_for(load.more_than(len(load.returned) + 20), lambda: "the load enqueues after the restart", 10)
    print(f"\nkill -9 and restart: {len(load.returned)} workflows, retries {stored.totals().get('enqueue_retries')}")
    assert load.raised == []
    # Every stored workflow was returned, once, and nothing else is stored: no half workflow.
    assert sorted(stored.workflow_ids()) == sorted(load.returned)
    assert stored.task_hashes() == len(load.returned) * (PARENTS + 1)
    assert len(stored.segment(Segment.WAITING)) == len(load.returned)
    assert len(stored.segment(Segment.READY)) == len(load.returned) * PARENTS
    assert stored.totals()["enqueued"] == len(load.returned) * (PARENTS + 1)
    assert stored.totals()["enqueue_retries"] > 0


def test_a_workflow_enqueue_with_wait_replicas_returns_once_a_slow_replica_has_all_of_it(
    make_fault_server, point_default
):
    primary, replica = make_fault_server(), make_fault_server()
    with Proxy(primary.valkey.port, name="replication") as link:
        control = redis.Redis.from_url(replica.url)
        control.replicaof("127.0.0.1", urlsplit(link.url).port)
        wait_for(
            lambda: control.info("replication").get("master_link_status") == "up",
            lambda: "the replica syncs with its primary",
            10,
        )
        # Replication 0.4 s behind, each way: without the wait a workflow returns long before the replica has it.
        link.latency(0.2)
        stored = point_default(primary.url, wait_replicas=1, socket_timeout=2)
        run = fan_in().enqueue()
        on_replica = Stored(replica.url)
        assert on_replica.workflow_ids() == [run.id]
        assert on_replica.task_hashes() == PARENTS + 1
        assert stored.workflow_ids() == [run.id]
