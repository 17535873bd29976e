"""What an aggregate's SQL needs of :class:`~.postgres.PostgresStore`: reads on the
pool and the ordered writer.  The engine's code is split by the store's aggregates
(:mod:`.repositories`), one mixin per module, all over this (as :mod:`.sqlite_room`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..messages import Message

if TYPE_CHECKING:
    import asyncpg

__all__ = [
    "MESSAGE_COLUMNS",
    "PostgresRoom",
    "WriteFn",
    "dumps",
    "insert_messages",
    "next_ids",
    "nul_free",
    "nul_free_json",
]

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


MESSAGE_COLUMNS = (
    "id, conversation_id, kind, content, author, channel, run_id, tool_call_id, tool_name,"
    " arguments, is_error, status, data, duration, created_at"
)
_INSERT_MESSAGES = (
    f"INSERT INTO message ({MESSAGE_COLUMNS}) SELECT * FROM unnest("
    "$1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],"
    " $8::text[], $9::text[], $10::text[], $11::boolean[], $12::text[], $13::jsonb[],"
    " $14::double precision[], $15::double precision[])"
)


async def insert_messages(conn: asyncpg.Connection, rows: Sequence[Message]) -> None:
    """Write audit-log rows (ids already taken from ``message_id_seq``) in one statement."""
    cols: list[list[Any]] = [[] for _ in range(15)]
    for m in rows:
        values = (
            m.id, m.conversation_id, m.kind, nul_free(m.content), nul_free(m.author),
            nul_free(m.channel), m.run_id, m.tool_call_id, m.tool_name, nul_free(m.arguments),
            m.is_error, m.status, dumps(m.data), m.duration, m.created_at,
        )  # fmt: skip
        for col, v in zip(cols, values, strict=True):
            col.append(v)
    await conn.execute(_INSERT_MESSAGES, *cols)


async def next_ids(conn: asyncpg.Connection, n: int) -> list[int]:
    """``n`` new audit-log ids, ascending."""
    if n == 1:
        return [int(await conn.fetchval("SELECT nextval('message_id_seq')"))]
    rows = await conn.fetch("SELECT nextval('message_id_seq') FROM generate_series(1, $1)", n)
    return sorted(int(r[0]) for r in rows)


class PostgresRoom:
    """The engine as an aggregate's SQL sees it (:class:`~.postgres.PostgresStore` is it)."""

    async def _read(self, sql: str, *args: Any) -> list[Any]:
        raise NotImplementedError

    async def _write(
        self,
        fn: WriteFn,
        *,
        conversation_id: str | None = None,
        single: bool = False,
        defer: bool = False,
        locks: tuple[int, ...] = (),
    ) -> Any:
        """Run ``fn`` in the writer's transaction; ``single``: ``fn`` runs exactly one
        statement (committed alone, it needs no BEGIN/COMMIT of its own); ``locks``:
        advisory locks held to the commit, taken before any job of the batch runs."""
        raise NotImplementedError

    async def _vacuum(self, *tables: str) -> None:
        raise NotImplementedError
