"""Each part of `lua/lib/` with logic of its own, run alone: a tiny script includes it and calls it.

The scripts are built by the scripts' own include expansion and EVALed on the session's Valkey.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import redis

from threadmill.backends import scripts
from threadmill.backends.limits import encode, parse_limit, share
from threadmill.backends.scripts import expand_includes

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
    source = scripts._source(name)
    assert "-- include:" not in source
    assert raw.script_load(source) == scripts.LuaScript(source).sha


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
    body = "local out = {} for p = 0, tonumber(ARGV[2]) - 1 do out[#out + 1] = share(tonumber(ARGV[1]), p, tonumber(ARGV[2])) end return out"
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
