"""Each part of `lua/lib/` with logic of its own, run alone: a tiny script includes it and calls it.

The scripts are built by the scripts' own include expansion and EVALed on the session's Valkey.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from threadmill.backends import script_source as scripts
from threadmill.backends.script_source import expand_includes
from threadmill.limits import encode, parse_limit, share

LUA = Path(scripts.__file__).parent / "lua"


@pytest.fixture
def lua(redis_url):
    """Run a Lua body after `-- include:` lines of the given parts; return its reply."""
    client = redis.Redis.from_url(redis_url)

    def run(parts: Sequence[str], body: str, keys: Sequence[str] = (), args: Sequence[object] = ()) -> object:
        source = "".join(f"-- include: {part}\n" for part in parts) + body
        return client.eval(expand_includes(source), len(keys), *keys, *args)

    yield run
    client.close()


@pytest.fixture
def raw(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# Every script and part: a Lua compile error (more than 200 locals in a function, 60 upvalues, a syntax
# error) would surface here as the server refusing SCRIPT LOAD.
@pytest.mark.parametrize("name", sorted(path.stem for path in LUA.glob("*.lua")))
def test_every_script_loads_with_its_includes(raw, name):
    source = scripts.script_source(name)
    assert "-- include:" not in source
    assert raw.script_load(source) == scripts.LuaScript(source).sha


#: Every command the scripts call that writes (any literal: `chunked` takes its command as an argument).
WRITES = frozenset(
    [
        "DEL",
        "EXPIRE",
        "HDEL",
        "HINCRBY",
        "HSET",
        "HSETNX",
        "INCR",
        "INCRBY",
        "LPUSH",
        "LTRIM",
        "PERSIST",
        "PEXPIRE",
        "SADD",
        "SET",
        "ZADD",
        "ZPOPMIN",
        "ZREM",
        "ZREMRANGEBYRANK",
        "ZREMRANGEBYSCORE",
    ]
)


@pytest.mark.parametrize("name", sorted(path.stem for path in LUA.glob("*.lua")))
def test_every_script_that_writes_runs_on_a_full_server_except_enqueue(name):
    # Without the flag a full server (maxmemory, noeviction) refuses a script at its first write
    # that may add data: workers could no longer drain it. A read-only script needs no flag. The
    # enqueues (a task, a workflow, a task added to a workflow) are the ones a full server must
    # refuse, before they write.
    source = scripts.script_source(name)
    writes = WRITES & set(re.findall(r"'([A-Z]+)'", source))
    enqueues = name in ("enqueue", "enqueue_workflow", "add_to_workflow")
    assert source.startswith("#!lua flags=allow-oom\n") == (bool(writes) and not enqueues), sorted(writes)


def _needs(part: str) -> list[str]:
    """The parts a lib part names in its "Needs a, b and c, included first." line."""
    found = re.search(r"^-- Needs (.+), included first\.$", (LUA / "lib" / f"{part}.lua").read_text(), re.MULTILINE)
    return re.split(r", | and ", found[1]) if found else []


@pytest.mark.parametrize("name", sorted(path.stem for path in LUA.glob("*.lua")))
def test_every_script_includes_what_its_parts_need_before_them(name):
    # A missing part is no compile error: its function would be an unknown global, failing only when called.
    included = re.findall(r"^-- include: (\w+)$", (LUA / f"{name}.lua").read_text(), re.MULTILINE)
    for at, part in enumerate(included):
        assert [need for need in _needs(part) if need not in included[:at]] == [], part


# limits
def test_the_lua_share_agrees_with_the_python_share_over_a_grid(lua):
    # One call computes the whole grid: limits 1..60 over 1..8 partitions, every partition.
    body = """
    local out = {}
    for total = 1, 60 do
      for partitions = 1, 8 do
        for partition = 0, partitions - 1 do
          out[#out + 1] = share(total, partition, partitions)
        end
      end
    end
    return out
    """
    expected = [share(t, p, n) for t in range(1, 61) for n in range(1, 9) for p in range(n)]
    assert lua(["limits"], body) == expected


@pytest.mark.parametrize(
    ("total", "partitions", "shares"),
    [
        (2, 3, [1, 1, 0]),  # below the partitions: check_partitions refuses it, the rule still adds up
        (3, 3, [1, 1, 1]),
        (7, 3, [3, 2, 2]),  # the remainder goes to the first partitions
        (8, 3, [3, 3, 2]),
        (100_000, 7, [14286, 14286, 14286, 14286, 14286, 14285, 14285]),
    ],
)
def test_share_splits_a_limit_so_the_shares_add_up(lua, total, partitions, shares):
    body = """
    local out, total, partitions = {}, tonumber(ARGV[1]), tonumber(ARGV[2])
    for p = 0, partitions - 1 do out[#out + 1] = share(total, p, partitions) end
    return out
    """
    assert lua(["limits"], body, args=[total, partitions]) == shares
    assert sum(shares) == total


@pytest.mark.parametrize(
    ("limit", "parts"),
    [
        ({"concurrency": 5}, [b"5", b"", b""]),
        ({"rate": "10/s"}, [b"", b"10", b"1"]),
        ({"rate": "10/m"}, [b"", b"10", b"60"]),
        ({"concurrency": 2, "rate": "100000/h"}, [b"2", b"100000", b"3600"]),
        ({}, [b"", b"", b""]),
    ],
)
def test_limit_parts_reads_what_limits_encode_writes(lua, limit, parts):
    assert lua(["limits"], "return {limit_parts(ARGV[1])}", args=[encode(parse_limit(limit))]) == parts


@pytest.mark.parametrize("text", ["5|10", "5|10|60|1", ""])
def test_limit_parts_is_nil_for_text_of_another_shape(lua, text):
    assert lua(["limits"], "return limit_parts(ARGV[1]) == nil and 1 or 0", args=[text]) == 1


@pytest.mark.parametrize(
    ("base", "over", "parts"),
    [
        ("5|10|60", "", [b"5", b"10", b"60"]),  # "" stands for none (false) below
        ("5|10|60", "|20|1", [b"5", b"20", b"1"]),  # the rate's count and period together
        ("5|10|60", "7||", [b"7", b"10", b"60"]),
        ("5|10|60", "||", [b"5", b"10", b"60"]),
        ("", "3||", [b"3", b"", b""]),
        ("", "", [b"", b"", b""]),
    ],
)
def test_limit_overlay_takes_each_non_empty_part_of_the_top_limit(lua, base, over, parts):
    body = "local function given(x) return x ~= '' and x end return {limit_overlay(given(ARGV[1]), given(ARGV[2]))}"
    assert lua(["limits"], body, args=[base, over]) == parts


# chunked
@pytest.mark.parametrize("length", [0, 1, 500, 501, 1203])
def test_call_chunked_sends_every_element_in_order(lua, raw, length):
    body = (
        "local list = {} for i = 1, tonumber(ARGV[1]) do list[i] = i end call_chunked('RPUSH', KEYS[1], list) return 1"
    )
    lua(["chunked"], body, keys=["t:list"], args=[length])
    assert raw.lrange("t:list", 0, -1) == [str(i).encode() for i in range(1, length + 1)]


# rate_tokens

TOKENS = ["chunked", "rate_tokens"]


@pytest.mark.parametrize("length", range(9))
def test_live_times_counts_the_times_after_the_cutoff_and_drops_the_older(lua, raw, length):
    for newer in range(length + 1):
        times = [100 + length - i for i in range(length)]  # newest first, one second apart
        raw.delete("t:times")
        if times:
            raw.rpush("t:times", *times)
        cutoff = times[newer - 1] - 0.5 if newer else 100 + length + 1
        assert lua(TOKENS, "return live_times(KEYS[1], tonumber(ARGV[1]))", ["t:times"], [cutoff]) == newer
        # Trimmed to the live ones only when some are live and some not (a wholly stale list expires).
        kept = newer if 0 < newer < length else length
        assert raw.llen("t:times") == kept


def test_live_times_counts_a_time_at_the_cutoff_as_spent_long_ago(lua, raw):
    raw.rpush("t:times", 30, 20, 10)
    assert lua(TOKENS, "return live_times(KEYS[1], 20)", ["t:times"]) == 1


def test_spend_tokens_keeps_the_newest_times_up_to_the_rate_and_expires_after_one_period(lua, raw):
    raw.rpush("t:times", "5.000000", "4.000000")
    lua(TOKENS, "spend_tokens(KEYS[1], 3, '9.000000', 4, 60) return 1", ["t:times"])
    assert raw.lrange("t:times", 0, -1) == [b"9.000000"] * 3 + [b"5.000000"]
    assert 59_000 < raw.pttl("t:times") <= 60_000


def test_spend_tokens_spends_more_than_one_chunk(lua, raw):
    lua(TOKENS, "spend_tokens(KEYS[1], 1203, '9.5', 2000, 0.25) return 1", ["t:times"])
    assert raw.llen("t:times") == 1203
    assert 0 < raw.pttl("t:times") <= 250


@pytest.mark.parametrize(
    ("times", "tokens", "now", "expected"),
    [
        ([10, 9], 3, 10, None),  # fewer kept than the rate: a token is free
        ([10, 9, 8], 3, 10, b"58"),  # the oldest of the 3 comes back a period (60 s) after 8
        ([10, 9, 8, 1], 3, 10, b"58"),
        ([10, 9, 8], 3, 70, b"0.001"),  # overdue: at least a millisecond
    ],
)
def test_next_token_in_waits_for_the_oldest_of_the_rate_s_tokens(lua, raw, times, tokens, now, expected):
    raw.rpush("t:times", *times)
    body = "local s = next_token_in(KEYS[1], tonumber(ARGV[1]), 60, tonumber(ARGV[2])) return s and tostring(s)"
    assert lua(TOKENS, body, ["t:times"], [tokens, now]) == expected


# queue_limits: the `held` reply


@pytest.mark.parametrize(
    ("wait", "path_wait", "path_held", "reply"),
    [
        ("", "", "0", b""),
        ("-1", "", "0", b"-1"),
        ("", "", "1", b"-1"),  # a path's concurrency alone
        ("-1", "2.5", "0", b"2.500"),  # a token coming back beats waiting on a slot
        ("3", "2", "0", b"2.000"),
        ("1", "2", "1", b"1.000"),
        ("0.25", "", "1", b"0.250"),
    ],
)
def test_held_reply_says_the_soonest_token_else_concurrency_else_nothing(lua, wait, path_wait, path_held, reply):
    body = "local function num(x) return x ~= '' and tonumber(x) or nil end\n"
    body += "return held_reply(num(ARGV[1]), num(ARGV[2]), ARGV[3] == '1')"
    parts = ["chunked", "limits", "rate_tokens", "queue_limits"]
    assert lua(parts, body, args=[wait, path_wait, path_held]) == reply


# filter
@pytest.mark.parametrize(
    ("data", "result", "read_error", "needles", "matches"),
    [
        ('{"args": ["alpha", "beta"]}', "", "", ["alpha", "beta"], True),
        ('{"args": ["alpha"]}', "", "", ["alpha", "beta"], False),
        ('{"args": ["alpha"]}', '{"errors": ["Boom"]}', "", ["alpha"], False),  # the result is read, not the payload
        ('{"args": ["alpha"]}', '{"errors": ["Boom"]}', "", ["Boom"], True),
        ("not json", "", "UnreadableTask: bad", ["not json", "UnreadableTask"], True),
        ("a.c", "", "", ["a%.c"], False),  # plain text, not a Lua pattern
        ("50%", "", "", ["0%"], True),
        ("anything", "", "", [], True),
    ],
)
def test_filter_matches_every_needle_as_plain_text_in_the_document(lua, data, result, read_error, needles, matches):
    body = "local function given(x) return x ~= '' and x end\n"
    body += "return filter_matches(ARGV[1], given(ARGV[2]), given(ARGV[3]), ARGV, 4, #ARGV) and 1 or 0"
    assert lua(["filter"], body, args=[data, result, read_error, *needles]) == int(matches)


# lease

LEASE = ["chunked", "lease"]


def _ids(rows: list) -> list[bytes]:
    """The ids of acquire-shaped rows: id, data, started_at, token, queue index, worker_losses."""
    return rows[::6]


def test_new_leases_leases_each_task_beside_its_payload_and_records_each_queue_once(lua, raw):
    raw.hset("t:task:a", mapping={"data": "A", "segment": "ready"})
    raw.hset("t:task:b", mapping={"data": "B", "started_at": "50.000000", "worker_losses": "1"})
    body = """
    local out = {}
    local leases = new_leases('t:task:', 'w', 'tok', '100.000000', '400.000000', out)
    leases.lease('a', 1)
    leases.lease('gone', 1)  -- no hash: skipped, no token spent
    leases.lease('b', 2)
    leases.record({{running = KEYS[1]}, {running = KEYS[2]}})
    out[#out + 1] = leases.count
    out[#out + 1] = leases.taken[1]
    return out
    """
    reply = lua(LEASE, body, ["t:running:1", "t:running:2"])
    assert reply == [b"a", b"A", b"100.000000", b"tok:1", 1, None, b"b", b"B", b"50.000000", b"tok:2", 2, b"1", 2, 1]
    assert raw.hgetall("t:task:a") == {
        b"data": b"A",
        b"segment": b"running",
        b"lease_worker": b"w",
        b"lease_started_at": b"100.000000",
        b"lease_token": b"tok:1",
        b"started_at": b"100.000000",
    }
    assert raw.hget("t:task:b", "started_at") == b"50.000000"  # a second attempt keeps the first start
    assert raw.hget("t:task:b", "progress") == b"tok:2 leased"  # a suspect's lease is marked
    assert raw.zrange("t:running:1", 0, -1, withscores=True) == [(b"a", 400.0)]
    assert raw.zrange("t:running:2", 0, -1, withscores=True) == [(b"b", 400.0)]
    assert not raw.exists("t:task:gone")


# round_robin

TURNS = ["chunked", "limits", "rate_tokens", "lease", "queue_limits", "round_robin"]
TURNS_BODY = """
local out = {}
local leases = new_leases('t:task:', 'w', 'tok', '1', '2', out)
local queues = {}
for q = 1, #KEYS do
  queues[q] = {ready = KEYS[q], running = KEYS[q] .. ':running', wake = KEYS[q] .. ':wake', name = 'q' .. q,
    paused = ARGV[2] == tostring(q)}
end
local limits = {room = {}, concurrency = {}, rate = {}}
if ARGV[3] ~= '' then
  limits.room[tonumber(ARGV[3])] = 1
end
local left = lease_round_robin(queues, tonumber(ARGV[1]), leases, limits, nil)
out[#out + 1] = left and 1 or 0  -- after the call: the rows are appended to `out` as it runs
return out
"""


@pytest.fixture
def three_queues(raw):
    for queue, ids in (("t:q1", ["a1", "a2", "a3"]), ("t:q2", ["b1", "b2"]), ("t:q3", ["c1"])):
        raw.zadd(queue, {task_id: i for i, task_id in enumerate(ids)})
        for task_id in ids:
            raw.hset(f"t:task:{task_id}", "data", task_id)
    return ["t:q1", "t:q2", "t:q3"]


@pytest.mark.parametrize(
    ("count", "paused", "limited", "ids", "left"),
    [
        (10, "", "2", [b"a1", b"b1", b"c1", b"a2", b"a3"], 0),  # q2 drops out at its room of 1, q3 when empty
        (3, "", "2", [b"a1", b"b1", b"c1"], 1),  # the call is full with tasks left
        (10, "1", "", [b"b1", b"c1", b"b2"], 0),  # a paused queue takes no turn
    ],
)
def test_lease_round_robin_gives_each_queue_a_turn_until_it_is_out_or_at_its_limit(
    lua, three_queues, count, paused, limited, ids, left
):
    reply = lua(TURNS, TURNS_BODY, three_queues, [count, paused, limited])
    assert _ids(reply[:-1]) == ids
    assert reply[-1] == left


def test_lease_round_robin_serves_one_queue_in_one_batch_up_to_its_room(lua, three_queues, raw):
    reply = lua(TURNS, TURNS_BODY, three_queues[:1], [10, "", "1"])
    assert _ids(reply[:-1]) == [b"a1"]
    assert reply[-1] == 0  # fewer than the count: no token passed on
    reply = lua(TURNS, TURNS_BODY, three_queues[:1], [2, "", ""])
    assert _ids(reply[:-1]) == [b"a2", b"a3"]
    assert reply[-1] == 1


def test_pass_the_token_on_wakes_the_first_queue_that_may_lease_and_has_no_token(lua, three_queues, raw):
    body = """
    local queues = {}
    for q = 1, #KEYS do
      queues[q] = {ready = KEYS[q], wake = KEYS[q] .. ':wake', paused = q == 1}
    end
    pass_the_token_on(queues, {room = {[2] = 0}}, {})
    return 1
    """
    lua(TURNS, body, three_queues)
    assert [raw.llen(f"{queue}:wake") for queue in three_queues] == [0, 0, 1]
    lua(TURNS, body, three_queues)
    assert raw.llen("t:q3:wake") == 1  # a token nobody took yet ends the chain


# task_limits and look

LOOK = ["chunked", "limits", "rate_tokens", "lease", "task_limits", "look"]


def test_task_limits_drop_stale_members_once_the_limit_binds_and_hold_at_the_share(lua, raw):
    raw.hset("t:specs", mapping={"p.c": "2||", "p.r": "|1|60"})
    raw.sadd("lim:p.c:running", "live", "old")
    raw.hset("t:task:live", "segment", "running")
    raw.hset("t:task:old", "segment", "successful")
    body = """
    local paths = task_limits(KEYS[1], 'lim:', 't:task:', 0, 1, 1000)
    local out = {}
    local function admits(path, q) out[#out + 1] = paths.admits(path, q) and 1 or 0 end
    admits('p.c', 1)  -- 2 members, one stale: recounted to 1, so one more fits
    paths.took('p.c', 'n1')
    admits('p.c', 1)
    admits('p.r', 2)
    paths.took('p.r', 'n2')
    admits('p.r', 2)
    admits('p.none', 2)
    out[#out + 1] = paths.held[1] and 1 or 0
    out[#out + 1] = paths.held[2] and 1 or 0
    out[#out + 1] = tostring(paths.record('1000.000000'))
    return out
    """
    assert lua(LOOK, body, ["t:specs"]) == [1, 0, 1, 0, 1, 1, 0, b"60"]
    assert raw.smembers("lim:p.c:running") == {b"live", b"n1"}
    assert raw.lrange("lim:p.r:lease-times", 0, -1) == [b"1000.000000"]


@pytest.fixture
def held_head(raw):
    raw.hset("t:specs", "p.c", "1||")
    raw.sadd("lim:p.c:running", "x")
    raw.hset("t:task:x", "segment", "running")
    ids = ["h1", "t2", "h3", "t4"]
    raw.zadd("t:ready", {task_id: i for i, task_id in enumerate(ids)})
    for task_id in ids:
        raw.hset(f"t:task:{task_id}", "data", task_id)
        if task_id.startswith("h"):
            raw.hset(f"t:task:{task_id}", "limit_path", "p.c")


LOOK_BODY = """
local out = {}
local leases = new_leases('t:task:', 'w', 'tok', '1', '2', out)
local paths = task_limits(KEYS[2], 'lim:', 't:task:', 0, 1, 1000)
local queues = {{ready = KEYS[1], name = 'q1'}}
local look = looks(queues, 1, tonumber(ARGV[1]), 't:task:', leases, paths)
local got = 0
while look.lease_next(1) do
  got = got + 1
end
look.record(KEYS[3])
out[#out + 1] = got
return out
"""


def test_a_look_leases_past_a_held_head_and_leaves_it_in_place(lua, raw, held_head):
    reply = lua(LOOK, LOOK_BODY, ["t:ready", "t:specs", "t:held"], [100])
    assert _ids(reply[:-1]) == [b"t2", b"t4"]
    assert reply[-1] == 2
    assert raw.zrange("t:ready", 0, -1) == [b"h1", b"h3"]
    assert raw.hgetall("t:held") == {b"q1": b"1"}


def test_a_look_reads_no_further_than_its_limit(lua, raw, held_head):
    reply = lua(LOOK, LOOK_BODY, ["t:ready", "t:specs", "t:held"], [2])
    assert _ids(reply[:-1]) == [b"t2"]
    assert raw.zrange("t:ready", 0, -1) == [b"h1", b"h3", b"t4"]
