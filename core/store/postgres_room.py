"""What an aggregate's SQL needs of :class:`~.postgres.PostgresStore`: reads on the
pool and the ordered writer.  The engine's code is split by the store's aggregates
(:mod:`.repositories`), one mixin per module, all over this (as :mod:`.sqlite_room`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresRoom", "WriteFn", "dumps", "nul_free", "nul_free_json"]

#: A write: run on the writer's connection, inside the transaction it commits in.
WriteFn = Callable[["asyncpg.Connection"], Awaitable[Any]]


def nul_free(text: str | None) -> str | None:
    """PostgreSQL's text cannot hold NUL: it is stored as U+FFFD (SQLite keeps it)."""
    if text is None or "\x00" not in text:
        return text
    return text.replace("\x00", "\ufffd")


def _nul_free_value(value: Any) -> Any:
    if isinstance(value, str):
        return nul_free(value)
    if isinstance(value, dict):
        return {nul_free(k): _nul_free_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nul_free_value(v) for v in value]
    return value


def nul_free_json(text: str | None) -> str | None:
    """JSON text for a ``jsonb`` column: ``jsonb`` refuses ``\\u0000`` (see :func:`nul_free`)."""
    if text is None or "\\u0000" not in text:
        return text
    return json.dumps(_nul_free_value(json.loads(text)), ensure_ascii=False)


def dumps(value: Any) -> str | None:
    """``value`` as JSON text for a ``jsonb`` column (``None`` stays SQL NULL)."""
    if value is None:
        return None
    return nul_free_json(json.dumps(value, ensure_ascii=False))


class PostgresRoom:
    """The engine as an aggregate's SQL sees it (:class:`~.postgres.PostgresStore` is it)."""

    async def _read(self, sql: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def _write(self, fn: WriteFn, *, conversation_id: str | None = None) -> Any:
        raise NotImplementedError

    async def _vacuum(self, *tables: str) -> None:
        raise NotImplementedError
