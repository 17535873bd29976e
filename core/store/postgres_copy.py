"""The PostgreSQL engine's side of ``agentik db copy`` (:class:`~.copy.CopyEngine`): a
``REPEATABLE READ`` read-only transaction on a connection of its own (one snapshot for
every table), rows streamed through a server-side cursor; writes with ``COPY`` (binary,
one transaction per batch) through the ordered writer; the sequences moved past the
copied ids at the end."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .copy import TABLES
from .postgres_room import PostgresRoom, nul_free, nul_free_json

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresCopy"]

_COLUMNS = (
    "SELECT table_name, column_name, data_type FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND table_name = ANY($1::text[])"
    " ORDER BY table_name, ordinal_position"
)
_KEYS = (
    "SELECT a.attname FROM pg_index i"
    " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
    " WHERE i.indrelid = $1::regclass AND i.indisprimary"
    " ORDER BY array_position(i.indkey, a.attnum)"
)
_SERIALS = (
    "SELECT table_name, column_name FROM information_schema.columns"
    " WHERE table_schema = current_schema() AND column_default LIKE 'nextval(%'"
)
#: Sequences a memory backend draws from by hand (not a column default): (table, column).
_DRAWN = {"memory_vector_seq": ("memory_vector", "seq")}


def _text(v: Any) -> Any:
    return nul_free(v) if isinstance(v, str) else v


def _json(v: Any) -> Any:
    if v is None:
        return None
    return nul_free_json(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))


def _float(v: Any) -> Any:
    return None if v is None else float(v)


def _int(v: Any) -> Any:
    return None if v is None else int(v)


def _bool(v: Any) -> Any:
    return None if v is None else bool(v)


#: A value from another engine (SQLite: flags 0/1, JSON as text) as COPY takes it.
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "boolean": _bool,
    "jsonb": _json,
    "json": _json,
    "double precision": _float,
    "real": _float,
    "bigint": _int,
    "integer": _int,
    "smallint": _int,
    "text": _text,
}


#: Types COPY's binary format takes from asyncpg (others, a ``tsvector`` say, go as text
#: through an INSERT that casts them).
_BINARY = frozenset({*_CONVERT, "bytea"})


def _insert_casting(table: str, columns: Sequence[str], kinds: dict[str, str]) -> str:
    """One INSERT of whole columns (arrays), each cast to its column's type."""
    arrays = ", ".join(
        f"${i}::{kinds[c] if kinds[c] in _BINARY else 'text'}[]" for i, c in enumerate(columns, 1)
    )
    names = ", ".join(f"c{i}" for i in range(1, len(columns) + 1))
    values = ", ".join(f"u.c{i}::{kinds[c]}" for i, c in enumerate(columns, 1))
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {values}"
        f" FROM unnest({arrays}) AS u({names})"
    )


class _Reader:
    def __init__(self, conn: asyncpg.Connection, order: dict[str, str]) -> None:
        self.conn = conn
        self.order = order

    async def count(self, table: str) -> int:
        return int(await self.conn.fetchval(f"SELECT COUNT(*) FROM {table}"))

    async def rows(
        self, table: str, columns: Sequence[str], batch: int
    ) -> AsyncGenerator[list[tuple[Any, ...]], None]:
        sql = f"SELECT {', '.join(columns)} FROM {table} ORDER BY {self.order[table]}"
        cursor = await self.conn.cursor(sql)
        while True:
            rows = await cursor.fetch(batch)
            if not rows:
                return
            yield [tuple(r) for r in rows]


class PostgresCopy(PostgresRoom):
    """``agentik db copy`` from and into a PostgreSQL database."""

    _pool: asyncpg.Pool | None

    async def _copy_schema(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in await self._read(_COLUMNS, list(TABLES)):
            out.setdefault(table, []).append((column, kind))
        return out

    async def copy_tables(self) -> dict[str, list[str]]:
        schema = await self._copy_schema()
        return {t: [c for c, _ in schema[t]] for t in TABLES if t in schema}

    async def copy_all_tables(self) -> list[str]:
        rows = await self._read(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        )
        return [str(r[0]) for r in rows]

    @contextlib.asynccontextmanager
    async def copy_reader(self) -> AsyncIterator[_Reader]:
        assert self._pool is not None
        order: dict[str, str] = {}
        for t in await self.copy_tables():
            keys = [r[0] for r in await self._read(_KEYS, t)]
            # Runs: the order they were written (SQLite's rowid), not their id.
            order[t] = "written" if t == "run" else ", ".join(keys) or "ctid"
        async with self._pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                yield _Reader(conn, order)

    async def copy_write(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        cache: dict[str, dict[str, str]] = self.__dict__.setdefault("_copy_kinds", {})
        if table not in cache:
            cache[table] = dict((await self._copy_schema())[table])
        kinds = cache[table]
        convert = [_CONVERT.get(kinds[c], _text) for c in columns]
        records = [tuple(f(v) for f, v in zip(convert, row, strict=True)) for row in rows]

        if all(kinds[c] in _BINARY for c in columns):

            async def fn(conn: asyncpg.Connection) -> None:
                await conn.copy_records_to_table(table, records=records, columns=list(columns))

        else:
            sql = _insert_casting(table, columns, kinds)
            arrays = [list(col) for col in zip(*records, strict=True)] or [[] for _ in columns]

            async def fn(conn: asyncpg.Connection) -> None:
                await conn.execute(sql, *arrays)

        await self._write(fn)

    async def copy_finish(self) -> None:
        serials = [
            (f"pg_get_serial_sequence('{t}', '{c}')", t, c) for t, c in await self._read(_SERIALS)
        ]
        have = {r[0] for r in await self._read("SELECT sequencename FROM pg_sequences")}
        serials += [(f"'{q}'", t, c) for q, (t, c) in _DRAWN.items() if q in have]

        async def fn(conn: asyncpg.Connection) -> None:
            for sequence, table, column in serials:
                await conn.execute(
                    f"SELECT setval({sequence},"
                    f" COALESCE((SELECT MAX({column}) FROM {table}), 0) + 1, false)"
                )

        await self._write(fn)
