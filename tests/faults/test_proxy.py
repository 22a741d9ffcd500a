"""The soak's TCP proxy against the session's real Valkey: it forwards, resets, stalls and delays."""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.faults.conftest import wait_for
from tests.faults.proxy import Proxy

#: The timeout of the clients through the proxy, seconds: short, so a stall fails fast.
SOCKET_TIMEOUT_S = 0.5


@pytest.fixture
def proxy(redis_url) -> Iterator[Proxy]:
    with Proxy(urlsplit(redis_url).port) as running:
        yield running


def client_through(proxy: Proxy) -> redis.Redis:
    """A client of the proxy on one connection that never retries, so each fault reaches the caller.

    Not a pool's: a pool checks a connection as it hands it out and quietly replaces a reset one.
    """
    return redis.Redis.from_url(
        proxy.url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
        single_connection_client=True,
    )


def round_trip_s(client: redis.Redis, count: int = 5) -> float:
    """The median seconds of a PING."""
    times = []
    for _ in range(count):
        began = time.perf_counter()
        client.ping()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def test_a_client_through_the_proxy_reads_and_writes(proxy, redis_url):
    client = client_through(proxy)
    client.set("proxied", "yes")
    assert redis.Redis.from_url(redis_url).get("proxied") == b"yes"
    assert client.get("proxied") == b"yes"


def test_a_reset_fails_the_open_connection_and_the_next_one_works(proxy):
    client = client_through(proxy)
    client.ping()
    assert proxy.reset() == 1
    with pytest.raises(redis.ConnectionError):
        client.ping()
    assert client.ping()  # A new connection goes through.


def test_a_stall_accepts_connections_but_a_command_times_out_until_it_ends(proxy):
    held = client_through(proxy)
    held.ping()
    proxy.stall(30)
    with pytest.raises(redis.TimeoutError):
        held.ping()
    with pytest.raises(redis.TimeoutError):  # A new client's handshake gets no reply either.
        client_through(proxy)
    wait_for(lambda: proxy.connections() == 2, lambda: f"the proxy holds both connections ({proxy.connections()})", 5)
    proxy.normal()
    assert client_through(proxy).ping()


def test_a_command_sent_during_a_stall_reaches_the_server_once_the_stall_ends(proxy, redis_url):
    with socket.create_connection(("127.0.0.1", proxy.port)) as raw:
        proxy.stall(30)
        raw.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nlate\r\n$1\r\n1\r\n")
        server = redis.Redis.from_url(redis_url)
        assert server.get("late") is None
        proxy.normal()
        wait_for(lambda: server.get("late") == b"1", lambda: "the stalled SET arrived", 5)


def test_added_latency_delays_each_round_trip_by_twice_its_value(proxy):
    client = client_through(proxy)
    base = round_trip_s(client)
    proxy.latency(0.1)
    delayed = round_trip_s(client)
    # 0.1 s each way; the margin is wide for a loaded two-core machine.
    assert 0.18 < delayed - base < 0.45, (base, delayed)
    proxy.normal()
    assert round_trip_s(client) < base + 0.1
