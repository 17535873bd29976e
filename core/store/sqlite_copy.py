"""The SQLite engine's side of ``agentik db copy`` (:class:`~.copy.CopyEngine`): one read
transaction on a read-only connection of its own (a consistent snapshot, the bot may
keep writing), rows streamed with ``fetchmany``; writes through the single writer."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .sqlite_room import SQLiteRoom

__all__ = ["SQLiteCopy"]


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def _tables(conn: sqlite3.Connection) -> dict[str, list[str]]:
    from .copy import TABLES  # `agentik db copy`'s module: not loaded by a running bot

    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return {t: _columns(conn, t) for t in TABLES if t in names}


def _order(conn: sqlite3.Connection, table: str) -> str:
    """The order rows were written in: the rowid, or a WITHOUT ROWID table's key."""
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if "WITHOUT ROWID" not in sql.upper():
        return "rowid"
    keys = sorted((r[5], r[1]) for r in conn.execute(f"PRAGMA table_info({table})") if r[5])
    return ", ".join(name for _, name in keys)


class _Reader:
    """A read transaction on a connection of its own, used from one thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="agentik-sqlite-copy")
        self.conn: sqlite3.Connection | None = None

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def _open(self) -> None:
        uri = f"file:{Path(self.path).absolute()}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA busy_timeout = 30000")
        self.conn.execute("BEGIN")
        self.conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")  # the snapshot starts here

    def _close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            self.conn.close()
            self.conn = None

    async def open(self) -> None:
        try:
            await self._call(self._open)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc

    async def close(self) -> None:
        await self._call(self._close)
        self.pool.shutdown(wait=False)

    async def count(self, table: str) -> int:
        assert self.conn is not None
        conn = self.conn
        (n,) = await self._call(lambda: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone())
        return int(n)

    async def rows(
        self, table: str, columns: Sequence[str], batch: int
    ) -> AsyncGenerator[list[tuple[Any, ...]], None]:
        assert self.conn is not None
        conn = self.conn

        def start() -> sqlite3.Cursor:
            return conn.execute(
                f"SELECT {', '.join(columns)} FROM {table} ORDER BY {_order(conn, table)}"
            )

        cursor = await self._call(start)
        try:
            while True:
                rows = await self._call(cursor.fetchmany, batch)
                if not rows:
                    return
                yield rows
        finally:
            with contextlib.suppress(sqlite3.Error):
                await self._call(cursor.close)


class SQLiteCopy(SQLiteRoom):
    """``agentik db copy`` from and into a SQLite database."""

    path: str

    async def copy_tables(self) -> dict[str, list[str]]:
        tables: dict[str, list[str]] = await self._write(_tables)
        return tables

    async def copy_all_tables(self) -> list[str]:
        rows = await self._write(
            lambda conn: conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            ).fetchall()
        )
        return [str(r[0]) for r in rows]

    @contextlib.asynccontextmanager
    async def copy_reader(self) -> AsyncIterator[_Reader]:
        if self.path == ":memory:":
            raise StoreError("an in-memory database cannot be copied")
        reader = _Reader(self.path)
        await reader.open()
        try:
            yield reader
        finally:
            await reader.close()

    async def copy_write(
        self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        await self._write(lambda conn: conn.executemany(sql, rows))

    async def copy_finish(self) -> None:
        return None  # rowids continue after the largest one copied
