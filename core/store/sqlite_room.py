"""What an aggregate's SQL needs of :class:`~.sqlite.SQLiteStore`: its reading
connection and its single writer.  The engine's code is split by the store's
aggregates (:mod:`.repositories`), one mixin per module, all over this."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SQLiteRoom"]


class SQLiteRoom:
    """The engine as an aggregate's SQL sees it (:class:`~.sqlite.SQLiteStore` is it)."""

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def _write(self, fn: Callable[[sqlite3.Connection], Any], *, defer: bool = False) -> Any:
        raise NotImplementedError

    async def run_write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        raise NotImplementedError

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _redact_securely(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        raise NotImplementedError
