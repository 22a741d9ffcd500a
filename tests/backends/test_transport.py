"""The thread path's script calls (`threadmill.backends.transport`): sent on raw connections, packed by hiredis."""

from __future__ import annotations

import pytest
import redis
from redis.connection import HiredisRespSerializer

from tests import tasks
from tests.calls import count_calls
from threadmill.backends.script_source import LuaScript
from threadmill.backends.transport import ServerTransport


def packer_calls(run) -> int:
    """Run `run()` and return how many times redis-py's hiredis packer ran on this thread meanwhile."""
    return count_calls(HiredisRespSerializer.pack.__code__, run)


def test_a_script_call_is_packed_by_hiredis_without_redis_pys_copy_of_its_arguments(backend):
    assert len(backend.acquire("default", count=3, worker="w-1")) == 0  # connects and loads the script
    enqueued = [backend.enqueue(tasks.echo, [i], {}) for i in range(3)]
    leased = []

    assert packer_calls(lambda: leased.extend(backend.acquire("default", count=3, worker="w-1"))) == 0
    assert leased and {r.id for r in leased} <= {r.id for r in enqueued}  # partitioned: one partition's tasks
    assert backend.acknowledge_many([(r, r.args[0]) for r in leased]) == [True] * len(leased)


def test_an_argument_hiredis_cannot_pack_is_refused_as_redis_py_refuses_it(server):
    transport = ServerTransport(redis.Redis.from_url(server.url))
    script = LuaScript("return ARGV[1]")

    assert transport.run(script, [], ["text"]) == b"text"
    with pytest.raises(redis.DataError):
        transport.run(script, [], [object()])
