"""Merging pages of several partitions into one, in queue order, and the keyset page it makes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: A place in a segment's order: (score exactly as the server wrote it, task id).
Cursor = tuple[str, str]
#: The fields of one row of a peek reply: id, data, result, started_at, lease_worker,
#: lease_started_at, lease_token, read_error, score, reported_progress.
ROW_WIDTH = 10


@dataclass(frozen=True, slots=True)
class KeysetPage:
    """One page of a segment read by cursor: its rows, the segment's total, and the cursors around it.

    `next_cursor` is None on the last page, `previous_cursor` None on the first.
    """

    items: list
    total: int
    next_cursor: Cursor | None = None
    previous_cursor: Cursor | None = None


def _order_key(row: Sequence[Any]) -> tuple[float, bytes]:
    # A sorted set orders by score, then by member bytes; ids are unique across partitions.
    return float(row[8]), row[0]


def merge_rows(replies: Sequence[tuple[list, int]], descending: bool, limit: int) -> tuple[list[list], bool]:
    """Merge the rows of several peek replies (each with the index of its first row) in segment order.

    Returns the first `limit` rows and whether there were more.
    """
    rows = [reply[i : i + ROW_WIDTH] for reply, first in replies for i in range(first, len(reply), ROW_WIDTH)]
    rows.sort(key=_order_key, reverse=descending)
    return rows[:limit], len(rows) > limit
