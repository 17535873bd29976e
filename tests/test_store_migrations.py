"""Schema migrations: numbered, recorded, applied from blank and from every version."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from agentik.core import SQLiteStore
from agentik.core.errors import MigrationError
from agentik.core.store.migrations import MIGRATIONS, apply_migrations, schema_version

LATEST = max(m.number for m in MIGRATIONS)
EXPECTED_TABLES = {
    "conversation",
    "channel_binding",
    "message",
    "working_memory",
    "schema_migrations",
    "budget_usage",
}


def tables(path):
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        con.close()


def test_migrations_are_numbered_consecutively_and_named():
    numbers = [m.number for m in MIGRATIONS]
    assert numbers == list(range(1, len(MIGRATIONS) + 1))
    assert all(m.name and m.name.isidentifier() for m in MIGRATIONS)


async def test_blank_database_gets_the_latest_schema(tmp_path):
    path = str(tmp_path / "blank.db")
    async with SQLiteStore(path):
        pass
    assert EXPECTED_TABLES <= tables(path)
    con = sqlite3.connect(path)
    rows = con.execute("SELECT number, name FROM schema_migrations ORDER BY number").fetchall()
    assert rows == [(m.number, m.name) for m in MIGRATIONS]
    assert con.execute("PRAGMA user_version").fetchone()[0] == LATEST
    con.close()


@pytest.mark.parametrize("start", sorted({0, *(m.number for m in MIGRATIONS)}))
async def test_upgrade_from_every_earlier_version(tmp_path, start):
    path = str(tmp_path / f"v{start}.db")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        apply_migrations(conn, target=start)
        assert schema_version(conn) == start
    async with SQLiteStore(path) as store:
        assert await store.list_conversations() == []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert schema_version(conn) == LATEST


async def test_reopening_applies_nothing_twice(tmp_path):
    path = str(tmp_path / "twice.db")
    async with SQLiteStore(path):
        pass
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        assert apply_migrations(conn) == []


async def test_newer_schema_is_refused(tmp_path):
    path = str(tmp_path / "future.db")
    async with SQLiteStore(path):
        pass
    con = sqlite3.connect(path)
    con.execute("INSERT INTO schema_migrations VALUES (999, 'from_the_future', 0)")
    con.commit()
    con.close()
    with pytest.raises(MigrationError, match="newer"):
        await SQLiteStore(path).start()


async def test_failed_migration_rolls_back(tmp_path):
    from agentik.core.store.migrations import Migration

    broken = (*MIGRATIONS, Migration(LATEST + 1, "broken", "CREATE TABLE t (x); SELECT nope();"))
    path = str(tmp_path / "broken.db")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        with pytest.raises(MigrationError, match="broken"):
            apply_migrations(conn, broken)
        assert schema_version(conn) == LATEST
    assert "t" not in tables(path)


def schema(path):
    with contextlib.closing(sqlite3.connect(path)) as con:
        return sorted(
            con.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            ).fetchall()
        )


async def test_a_database_with_a_gap_in_its_migrations_gets_the_missing_ones(tmp_path):
    """A build whose migrations were merged out of order (this repository's
    ``integ`` at 43bd3e1 had 1-4 and 8) made databases at version 8 without
    5-7 (access grants, approvals, budget usage).  Opening one applies the
    missing migrations too, after a backup; ``db migrate --dry-run`` lists them."""
    from agentik.core.store import care

    path = str(tmp_path / "gap.db")
    built = tuple(m for m in MIGRATIONS if m.number in (1, 2, 3, 4, 8))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        apply_migrations(conn, built)
        assert schema_version(conn) == 8
    current, pending = care.pending_migrations(path)
    assert current == 8
    assert [m.number for m in pending] == [5, 6, 7, *range(9, LATEST + 1)]
    async with SQLiteStore(path):
        pass
    fresh = str(tmp_path / "fresh.db")
    async with SQLiteStore(fresh):
        pass
    assert schema(path) == schema(fresh)
    assert list(tmp_path.glob("gap.db.pre-v*.bak"))
    with contextlib.closing(sqlite3.connect(path)) as con:
        numbers = [r[0] for r in con.execute("SELECT number FROM schema_migrations")]
    assert sorted(numbers) == [m.number for m in MIGRATIONS]
