"""The Lua scripts' sources: each read from `lua/`, its `-- include:` lines filled in, and named by its SHA1."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .keys import KeySchema

#: A line of a script that stands for a file of `lua/lib/` (shared local functions), as `-- include: keyset`.
_INCLUDE = re.compile(r"^-- include: (\w+)$", re.MULTILINE)


def expand_includes(text: str) -> str:
    """Return Lua `text` with each `-- include: <lib>` line replaced by `lua/lib/<lib>.lua` (not recursive)."""
    lib = files("threadmill.backends").joinpath("lua", "lib")
    return _INCLUDE.sub(lambda m: lib.joinpath(f"{m.group(1)}.lua").read_text(), text)


def script_source(name: str) -> str:
    """Return a script's source, its includes expanded."""
    return expand_includes(files("threadmill.backends").joinpath("lua", f"{name}.lua").read_text())


class LuaScript:
    """A script's source and its SHA1, the name EVALSHA calls it by."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class ScriptHost:
    """What a family of script wrappers uses of `scripts.RedisScripts`, which they are all base classes of."""

    keys: KeySchema

    def _run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        raise NotImplementedError

    def segment_keys(self, queue_name: str) -> list[str]:
        raise NotImplementedError
