"""Counting the calls of one Python function while some code runs, on this thread (sys.setprofile)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import CodeType


def count_calls(code: CodeType, run: Callable[[], object]) -> int:
    """Run `run()` and return how many times the function whose code object is `code` was called on this thread."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code is code:
            calls += 1

    sys.setprofile(count)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls
