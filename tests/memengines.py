"""The conversations' database on either engine, for the memory tests that are
about behaviour: the same test runs on SQLite (a file) and on PostgreSQL (the real
server of :mod:`pgserver`).

PYTEST_DONT_REWRITE

* ``engine`` (parametrized ``sqlite``/``postgres``): the engine's name.  Its
  PostgreSQL server starts (once per xdist worker) before any event loop runs.
* ``open_db``: a function returning a new, unstarted store on this test's
  database and the memory class of that engine (``SQLiteMemory`` or
  ``PostgresMemory``); called again, it opens the same database (a restart).  The
  PostgreSQL database is emptied before the test.

Use them with ``pytest_plugins = ["pgserver", "memengines"]`` in a test module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

__all__ = ["engine", "open_db", "opener"]


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("postgres_server")  # started outside any event loop
    return str(request.param)


async def opener(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> Callable[[], tuple[Any, Any]]:
    """What ``open_db`` gives, for an engine chosen otherwise (the PostgreSQL server
    must be started already: see ``engine``)."""
    if kind == "postgres":
        from pgserver import TESTS, empty_database

        from agentik.core.memory.postgres import PostgresMemory
        from agentik.core.store.postgres import PostgresStore

        dsn = request.getfixturevalue("postgres_server").dsn(TESTS)
        await empty_database(dsn)
        return lambda: (PostgresStore(dsn), PostgresMemory)
    from agentik.core import SQLiteStore
    from agentik.core.memory.sqlite import SQLiteMemory

    path = str(tmp_path / "bot.db")
    return lambda: (SQLiteStore(path), SQLiteMemory)


@pytest_asyncio.fixture
async def open_db(
    engine: str, request: pytest.FixtureRequest, tmp_path: Any
) -> Callable[[], tuple[Any, Any]]:
    return await opener(engine, request, tmp_path)
