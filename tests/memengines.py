"""The conversations' database on either engine, for the memory tests that are
about behaviour: the same test runs on SQLite (a file) and on PostgreSQL (the real
server of :mod:`pgserver`).

PYTEST_DONT_REWRITE

* ``engine`` (parametrized ``sqlite``/``postgres``): the engine's name.  Its
  PostgreSQL server starts (once per xdist worker) before any event loop runs.
* ``open_db``: a :class:`Database`: called, a new, unstarted store on this test's
  database and the memory class of that engine (``SQLiteMemory`` or
  ``PostgresMemory``); called again, it opens the same database (a restart).  The
  PostgreSQL database is emptied before the test.

Use them with ``pytest_plugins = ["pgserver", "memengines"]`` in a test module.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio

__all__ = ["Database", "engine", "open_db", "opener"]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("postgres_server")  # started outside any event loop
    return str(request.param)


class Database:
    """This test's database on one engine: calling it gives a new, unstarted store
    on it and the memory class of that engine; :meth:`rows` reads it raw (another
    connection, as an operator would)."""

    def __init__(self, kind: str, where: str) -> None:
        self.kind, self.where = kind, where

    def __call__(self) -> tuple[Any, Any]:
        if self.kind == "postgres":
            from agentik.core.memory.postgres import PostgresMemory
            from agentik.core.store.postgres import PostgresStore

            return PostgresStore(self.where), PostgresMemory
        from agentik.core import SQLiteStore
        from agentik.core.memory.sqlite import SQLiteMemory

        return SQLiteStore(self.where), SQLiteMemory

    async def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (no parameters: the same text on both engines)."""
        if self.kind == "postgres":
            import asyncpg

            conn = await asyncpg.connect(self.where)
            try:
                return [tuple(r) for r in await conn.fetch(sql)]
            finally:
                await conn.close()
        import sqlite3

        db = sqlite3.connect(self.where)
        try:
            return db.execute(sql).fetchall()
        finally:
            db.close()


async def opener(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> Database:
    """What ``open_db`` gives, for an engine chosen otherwise (the PostgreSQL server
    must be started already: see ``engine``)."""
    if kind == "postgres":
        from pgserver import TESTS, empty_database

        dsn = request.getfixturevalue("postgres_server").dsn(TESTS)
        await empty_database(dsn)
        return Database(kind, dsn)
    return Database(kind, str(tmp_path / "bot.db"))


@pytest_asyncio.fixture
async def open_db(engine: str, request: pytest.FixtureRequest, tmp_path: Any) -> Database:
    return await opener(engine, request, tmp_path)
