"""``KeyedLocks``: one asyncio lock per key, kept only while in use."""

from __future__ import annotations

import asyncio
import weakref

__all__ = ["KeyedLocks"]


class KeyedLocks:
    """``locks(key)`` is the lock for ``key``; unused locks are forgotten.

    Holders keep the lock alive (a weak-value map), so a bot that has seen
    many channels does not keep a lock for each.
    """

    __slots__ = ("_locks",)

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def __call__(self, key: str) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def __len__(self) -> int:
        return len(self._locks)
