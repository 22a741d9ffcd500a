"""Reading a subprocess's output while a test waits for a line, without losing lines to buffering."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import IO


class LineReader:
    """Collects a process's text output, line by line, on a daemon thread.

    A selector on the pipe plus `readline` can miss lines: one read buffers several, and the
    selector then reports nothing new until the process writes again. A reader thread cannot.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip())
                self._changed.notify_all()
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """Return the first line starting with `prefix`, waiting up to `timeout` s; None if none came."""
        return self._wait_for_line(lambda line: line.startswith(prefix), timeout)

    def wait_for_containing(self, text: str, timeout: float) -> str | None:
        """Return the first line containing `text`, waiting up to `timeout` s; None if none came."""
        return self._wait_for_line(lambda line: text in line, timeout)

    def _wait_for_line(self, wanted: Callable[[str], bool], timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if wanted(line):
                        return line
                remaining = deadline - time.monotonic()
                if self.closed or remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the process closed its output (it exited); True when it did."""
        with self._changed:
            return self._changed.wait_for(lambda: self.closed, timeout)
