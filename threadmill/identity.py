"""Worker names: who holds a lease, sends a heartbeat and appears in `worker_ids`.

A name is `host:pid:incarnation`, the incarnation eight random letters chosen when the
process starts. Host and pid alone are reused: a container that restarts in a fresh PID
namespace gives its new processes the old pids and hostname, and the dead process's name
would heartbeat again, so its leases would look live. The incarnation makes every process
start a new name. Names of an older release, `host:pid`, still parse (their incarnation is
""), so both kinds of worker can share a server during a rolling deploy. This module is the
one place names are built and read.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import string
import threading
from dataclasses import dataclass

#: Letters of an incarnation: never all digits, so `host:pid:incarnation` never reads as an old `host:pid`.
INCARNATION_LETTERS = string.ascii_lowercase
#: Length of an incarnation: 26**8 (about 2e11) choices for one host and pid.
INCARNATION_LENGTH = 8

_NAME = re.compile(r"(?P<host>.+):(?P<pid>[0-9]{1,10})(?::(?P<incarnation>[a-z]{1,32}))?")


def new_incarnation() -> str:
    """Return a fresh random incarnation for a process about to start."""
    return "".join(secrets.choice(INCARNATION_LETTERS) for _ in range(INCARNATION_LENGTH))


@dataclass(frozen=True, slots=True)
class WorkerName:
    """A worker process's name, split into host, pid and incarnation ("" for an older release's name)."""

    host: str
    pid: int
    incarnation: str = ""

    @classmethod
    def for_process(cls, incarnation: str, pid: int | None = None) -> WorkerName:
        """Return the name of a process of this host (this one unless `pid` is given) in `incarnation`."""
        return cls(socket.gethostname(), os.getpid() if pid is None else pid, incarnation)

    @classmethod
    def parse(cls, name: str) -> WorkerName | None:
        """Return a name of either form (`host:pid:incarnation`, `host:pid`) split up, or None for any other text."""
        match = _NAME.fullmatch(name)
        if match is None:
            return None
        return cls(match["host"], int(match["pid"]), match["incarnation"] or "")

    @property
    def process(self) -> str:
        """Return `host:pid`, how people tell processes apart on screen."""
        return f"{self.host}:{self.pid}"

    def __str__(self) -> str:
        return f"{self.process}:{self.incarnation}" if self.incarnation else self.process


_lock = threading.Lock()
_this_process = ""


def this_process_name() -> str:
    """Return this process's name, chosen once per process; a forked child chooses its own."""
    global _this_process
    with _lock:
        if not _this_process:
            _this_process = str(WorkerName.for_process(new_incarnation()))
        return _this_process


def name_this_process(incarnation: str) -> str:
    """Make this process's name the one of `incarnation` (a supervisor chose it before the fork) and return it."""
    global _this_process
    with _lock:
        _this_process = str(WorkerName.for_process(incarnation))
        return _this_process


def _forget_in_child() -> None:
    # A fork copies the name (and maybe a held lock): the child is another process.
    global _lock, _this_process
    _lock, _this_process = threading.Lock(), ""


os.register_at_fork(after_in_child=_forget_in_child)


__all__ = ["WorkerName", "name_this_process", "new_incarnation", "this_process_name"]
