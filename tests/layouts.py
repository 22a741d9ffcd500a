"""What the layout-version tests share: the `default` alias's layout key and the refusal they expect."""

from __future__ import annotations

import redis

#: The `default` alias's layout version key.
LAYOUT = "threadmill:{default}:layout"


def refusal(stored: str) -> str:
    return (
        f"The data of task backend 'default' has layout version {stored}, and this Threadmill knows layouts up "
        f"to 3. Upgrade Threadmill on every host to a release that knows layout {stored}; or, to go back to "
        f"this release, drain the alias with the release that wrote it and delete the key {LAYOUT}, so this "
        "release records its own layout again."
    )


def stamp_layout(url: str, version: str) -> None:
    """Store `version` as the `default` alias's layout on the server at `url`, as a newer release would."""
    with redis.Redis.from_url(url) as raw:
        raw.set(LAYOUT, version)
