"""The embedded Valkey: persistence across restarts, one copy per data directory, clean stop."""

from __future__ import annotations

import pytest
import redis

from threadmill.embedded import EmbeddedValkey, free_port
from threadmill.exceptions import EmbeddedServerError


def test_a_restart_keeps_the_data(tmp_path):
    port = free_port()
    with EmbeddedValkey(tmp_path, port) as server:
        redis.Redis.from_url(server.url).set("kept", "yes")
    with EmbeddedValkey(tmp_path, port) as server:
        assert redis.Redis.from_url(server.url).get("kept") == b"yes"


def test_a_second_copy_on_the_same_data_directory_is_refused(tmp_path):
    with EmbeddedValkey(tmp_path, free_port()), pytest.raises(EmbeddedServerError, match="already runs on"):
        EmbeddedValkey(tmp_path, free_port()).start()


def test_stop_ends_the_process_and_frees_the_directory(tmp_path):
    server = EmbeddedValkey(tmp_path, free_port()).start()
    server.stop()
    assert server.process.poll() is not None
    with EmbeddedValkey(tmp_path, free_port()) as again:
        assert redis.Redis.from_url(again.url).ping()


def test_a_taken_port_is_a_clear_error(tmp_path):
    with (
        EmbeddedValkey(tmp_path / "a", free_port()) as first,
        pytest.raises(EmbeddedServerError, match="already in use"),
    ):
        EmbeddedValkey(tmp_path / "b", first.port).start()
