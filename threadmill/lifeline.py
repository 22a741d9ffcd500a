"""Tie a child process's life to its parent's, so a parent killed with SIGKILL leaves nothing behind.

Linux's `PR_SET_PDEATHSIG` sends the child a signal when the parent dies, whatever the cause.
Elsewhere this does nothing, and children rely on their own checks (a worker process polls
its parent pid).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl option: the signal the calling process receives when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, signum: int = signal.SIGTERM):
    """Return a `preexec_fn` that makes the child receive `signum` when `parent_pid` dies."""

    def arrange() -> None:
        if sys.platform != "linux":
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        # The parent may have died between fork and prctl: then nothing would ever signal us.
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signum)

    return arrange
