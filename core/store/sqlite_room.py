"""What an aggregate's SQL needs of :class:`~.sqlite.SQLiteStore`: its reading
connection and its single writer.  The engine's code is split by the store's
aggregates (:mod:`.repositories`), one mixin per module, all over this."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .snapshot import ImportResult

__all__ = ["SQLiteRoom"]


class SQLiteRoom:
    """The engine as an aggregate's SQL sees it (:class:`~.sqlite.SQLiteStore` is it)."""

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    async def _write(self, fn: Callable[[sqlite3.Connection], Any], *, defer: bool = False) -> Any:
        raise NotImplementedError

    async def _write_op(self, name: str, *args: Any, defer: bool = False) -> Any:
        raise NotImplementedError

    async def run_write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        raise NotImplementedError

    async def _in_writer(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _redact_securely(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        raise NotImplementedError

    async def with_import_blobs(
        self, blobs: Sequence[bytes], write: Callable[[], Awaitable[ImportResult]]
    ) -> ImportResult:
        """A snapshot import writing ``blobs`` (its attachments' bytes) and, in its one
        transaction (``write``), the rows naming them: the attachments' aggregate
        (:class:`~.sqlite_attachments.SQLiteAttachments`) guards it; the lifecycle's
        import calls it."""
        raise NotImplementedError
