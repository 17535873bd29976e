"""Database care: the backup before a migration, ``agentik db backup|check|vacuum|migrate``.

Real SQLite files throughout, the installed ``agentik`` command as a subprocess.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
from pathlib import Path

from agentik.core import SQLiteStore
from agentik.core.store.migrations import MIGRATIONS, apply_migrations, schema_version
from helpers import agentik

LATEST = max(m.number for m in MIGRATIONS)
OLD = 3  # an old schema version with conversations and messages


def config(tmp_path: Path, db: str = "bot.db") -> str:
    path = tmp_path / "bot.toml"
    path.write_text(f'[storage]\npath = "{db}"\n', encoding="utf-8")
    return str(path)


def old_database(path: str, version: int = OLD, conversations: int = 3) -> list[tuple]:
    """A database left at schema ``version`` by an older agentik, with some rows."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        apply_migrations(conn, target=version)
        for i in range(conversations):
            conn.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, ?, ?)",
                (f"c{i}", f"talk {i}", 1.0 + i, 2.0 + i),
            )
            conn.execute(
                "INSERT INTO message (conversation_id, kind, content, created_at)"
                " VALUES (?, 'user', ?, ?)",
                (f"c{i}", f"hello {i}", 3.0 + i),
            )
        return rows(conn)


def rows(conn: sqlite3.Connection) -> list[tuple]:
    return conn.execute(
        "SELECT c.id, c.title, m.content FROM conversation c JOIN message m"
        " ON m.conversation_id = c.id ORDER BY c.id"
    ).fetchall()


def backups(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.pre-v*.bak"))


# -- the backup before a migration -------------------------------------------------------------


async def test_migrating_an_old_database_backs_it_up_first(tmp_path, caplog):
    path = str(tmp_path / "bot.db")
    before = old_database(path)
    caplog.set_level(logging.WARNING, logger="agentik.core.store.care")
    async with SQLiteStore(path) as store:
        assert [c.id for c in await store.list_conversations()] == ["c2", "c1", "c0"]
    [backup] = backups(tmp_path)
    assert re.fullmatch(rf"bot\.db\.pre-v{LATEST}-\d{{8}}-\d{{6}}\.bak", backup.name)
    # The copy is the database as it was: old schema version, the same rows.
    with contextlib.closing(sqlite3.connect(backup)) as conn:
        assert schema_version(conn) == OLD
        assert rows(conn) == before
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert schema_version(conn) == LATEST
    logged = [r.getMessage() for r in caplog.records]
    assert any(str(backup) in m and f"schema version {OLD}" in m for m in logged), logged


async def test_a_fresh_or_current_database_gets_no_backup(tmp_path):
    path = str(tmp_path / "bot.db")
    async with SQLiteStore(path):  # blank: nothing to lose
        pass
    async with SQLiteStore(path):  # already at the latest version: nothing to migrate
        pass
    assert backups(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bot.db"]


# -- agentik db backup -------------------------------------------------------------------------


def test_db_backup_while_another_connection_writes(tmp_path):
    path = str(tmp_path / "bot.db")
    old_database(path, version=LATEST, conversations=0)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")  # as the running bot has it
    started = threading.Event()
    stop = threading.Event()
    written = [0]

    def writer() -> None:
        # Each transaction writes a pair of rows: a consistent copy has whole pairs.
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA busy_timeout = 60000")
            i = 0
            while not stop.is_set():
                conn.execute("BEGIN IMMEDIATE")
                for part in ("a", "b"):
                    conn.execute(
                        "INSERT INTO conversation (id, title, created_at, updated_at)"
                        " VALUES (?, '', 0, 0)",
                        (f"{i:06d}{part}",),
                    )
                conn.execute("COMMIT")
                i += 1
                written[0] = i
                if i == 50:
                    started.set()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert started.wait(60)
        result = agentik("db", "backup", "copy.db", "-c", config(tmp_path), cwd=tmp_path)
        written_during = written[0]
    finally:
        stop.set()
        thread.join(60)
    assert result.returncode == 0, result.stderr
    assert "backed up" in result.stdout and "copy.db" in result.stdout
    with contextlib.closing(sqlite3.connect(tmp_path / "copy.db")) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        ids = [r[0] for r in conn.execute("SELECT id FROM conversation ORDER BY id")]
        assert schema_version(conn) == LATEST
    assert len(ids) >= 100  # the 50 pairs written before the backup started
    assert len(ids) // 2 <= written_during
    # Whole transactions only: pairs 0..n-1, each with both rows.
    n = len(ids) // 2
    assert ids == [f"{i:06d}{p}" for i in range(n) for p in ("a", "b")]
    assert not list(tmp_path.glob("*.tmp-*"))


def test_db_backup_never_overwrites_a_file(tmp_path):
    path = str(tmp_path / "bot.db")
    old_database(path, version=LATEST)
    (tmp_path / "copy.db").write_text("precious", encoding="utf-8")
    result = agentik("db", "backup", "copy.db", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert "already exists" in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "copy.db").read_text(encoding="utf-8") == "precious"


def test_db_backup_default_name_is_next_to_the_database(tmp_path):
    path = str(tmp_path / "bot.db")
    before = old_database(path, version=LATEST)
    result = agentik("db", "backup", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [copy] = tmp_path.glob("bot.db.backup-*.db")
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        assert rows(conn) == before


# -- agentik db check --------------------------------------------------------------------------


def test_db_check_of_a_healthy_database(tmp_path):
    old_database(str(tmp_path / "bot.db"), version=LATEST)
    result = agentik("db", "check", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"schema version: {LATEST}" in result.stdout
    assert "ok: integrity check and foreign key check passed" in result.stdout


def test_db_check_of_a_corrupted_file_exits_1_and_says_what_is_wrong(tmp_path):
    path = tmp_path / "bot.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        apply_migrations(conn)
        conn.execute("BEGIN")
        for i in range(2000):
            conn.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, 0, 0)",
                (f"c{i:05d}", "x" * 100),
            )
        conn.execute("COMMIT")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    data = bytearray(path.read_bytes())
    # Flip bytes in the middle of the file: b-tree pages of the conversation table.
    for page in range(pages // 2, pages // 2 + 3):
        start = page * page_size
        for i in range(start, start + 64):
            data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    result = agentik("db", "check", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert "problem:" in result.stdout
    assert "problem" in result.stderr and "bot.db" in result.stderr
    assert "Traceback" not in result.stderr


def test_db_check_of_a_file_that_is_not_a_database(tmp_path):
    (tmp_path / "bot.db").write_bytes(b"this is not SQLite at all " * 100)
    result = agentik("db", "check", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 1
    assert "not a readable SQLite database" in result.stdout
    assert "Traceback" not in result.stderr


def test_db_check_of_an_old_schema_is_ok_with_a_note(tmp_path):
    old_database(str(tmp_path / "bot.db"))
    result = agentik("db", "check", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"schema version {OLD} of {LATEST}: the next start migrates it" in result.stdout


def test_db_commands_without_a_database_exit_2(tmp_path):
    for action in ("backup", "check", "vacuum", "migrate"):
        result = agentik("db", action, "-c", config(tmp_path), cwd=tmp_path)
        assert result.returncode == 2
        assert "no database at" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bot.toml"]


# -- agentik db migrate ------------------------------------------------------------------------


def test_migrate_dry_run_lists_the_pending_migrations_and_changes_nothing(tmp_path):
    path = tmp_path / "bot.db"
    before = old_database(str(path))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")  # as a bot leaves it
    cfg = config(tmp_path)
    snapshot = (path.read_bytes(), path.stat().st_mtime_ns)
    listing = sorted(p.name for p in tmp_path.iterdir())
    result = agentik("db", "migrate", "--dry-run", "-c", cfg, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pending = [m for m in MIGRATIONS if m.number > OLD]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("  ")]
    assert lines == [[str(m.number), m.name] for m in pending]
    assert f"schema version {OLD}; would apply {len(pending)} migration(s)" in result.stdout
    assert "nothing was changed" in result.stdout
    assert (path.read_bytes(), path.stat().st_mtime_ns) == snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == listing

    # The real thing: migrated, with the backup taken first.
    result = agentik("db", "migrate", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"now at schema version {LATEST}" in result.stdout
    [backup] = backups(tmp_path)
    assert str(backup.name) in result.stderr  # logged at WARNING
    with contextlib.closing(sqlite3.connect(backup)) as conn:
        assert schema_version(conn) == OLD
        assert rows(conn) == before
    result = agentik("db", "migrate", "--dry-run", "-c", config(tmp_path), cwd=tmp_path)
    assert "up to date, nothing to migrate" in result.stdout


# -- agentik db vacuum -------------------------------------------------------------------------


def test_db_vacuum_reclaims_the_space_of_deleted_rows(tmp_path):
    path = tmp_path / "bot.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        apply_migrations(conn)
        conn.execute("BEGIN")
        for i in range(3000):
            conn.execute(
                "INSERT INTO conversation (id, title, created_at, updated_at) VALUES (?, ?, 0, 0)",
                (f"c{i:05d}", "x" * 200),
            )
        conn.execute("COMMIT")
        conn.execute("DELETE FROM conversation WHERE id > 'c00010'")
    size = path.stat().st_size
    result = agentik("db", "vacuum", "-c", config(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # What the deleted rows took is given back: the file ends close to an empty
    # database of the same schema (its size grows with every migration's tables,
    # so it is measured, not assumed), far from where it started.
    empty = tmp_path / "empty.db"
    with contextlib.closing(sqlite3.connect(empty, isolation_level=None)) as conn:
        apply_migrations(conn)
        conn.execute("VACUUM")
    schema = empty.stat().st_size
    assert path.stat().st_size - schema < (size - schema) / 10
    assert f"{size:,} ->" in result.stdout
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM conversation").fetchone() == (11,)
