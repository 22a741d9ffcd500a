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

    __slots__ = ("_name", "_sha", "_source")

    def __init__(self, source: str | None = None, *, name: str = "") -> None:
        self._name = name
        self._source = source
        self._sha = None if source is None else hashlib.sha1(source.encode()).hexdigest()

    @classmethod
    def named(cls, name: str) -> LuaScript:
        """Return `lua/<name>.lua`, read and hashed at its first use.

        A process uses a few of the scripts: reading and hashing all of them when a backend made its
        wrappers took a worker's start 4 ms on the way to its first task.
        """
        return cls(name=name)

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = script_source(self._name)  # two threads may both read it: the same text
        return self._source

    @property
    def sha(self) -> str:
        if self._sha is None:
            self._sha = hashlib.sha1(self.source.encode()).hexdigest()
        return self._sha


class ScriptHost:
    """What a family of script wrappers uses of `scripts.RedisScripts`, which they are all base classes of."""

    keys: KeySchema

    def _run(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _run_durably(self, script: LuaScript, keys: Sequence[str], args: Sequence[Any], wait_s: float) -> tuple:
        raise NotImplementedError

    def segment_keys(self, queue_name: str) -> list[str]:
        raise NotImplementedError
