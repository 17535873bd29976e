"""One object for equal values that many holders keep.

Channels and conversations keep many values equal to each other's: the same
speaker's name in every channel it talks in, the same access decision for
every channel under the same rules.  :class:`Canonical` hands back the first
object equal to a value, so they keep one.  Its table is bounded: past
``most`` values it starts over, so a flood of distinct values (names from the
network) costs a bounded table, never a growing one.

Not ``sys.intern`` for strings: they may come from the network, and on Python
3.12.0-3.12.5 interned strings are never freed.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Canonical"]

H = TypeVar("H", bound=Hashable)


class Canonical(Generic[H]):
    """``canonical(value)``: the first object equal to ``value`` seen since the
    table last started over (at most ``most`` of them)."""

    __slots__ = ("_most", "_table")

    def __init__(self, most: int = 4096) -> None:
        self._most = most
        self._table: dict[H, H] = {}

    def __call__(self, value: H) -> H:
        table = self._table
        found = table.get(value)
        if found is None:
            if len(table) >= self._most:
                table.clear()
            table[value] = found = value
        return found

    def __len__(self) -> int:
        return len(self._table)
