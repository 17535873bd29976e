"""Looking after the SQLite database file: backups, checks, vacuum, pending migrations.

Everything here is synchronous :mod:`sqlite3` work on a path (the command
line's ``agentik db`` runs it; :class:`~agentik.core.store.sqlite.SQLiteStore`
calls :func:`backup_before_migrating` from its writer thread).

Backups use SQLite's online backup API (:meth:`sqlite3.Connection.backup`)
in one step: the copy is a consistent snapshot even while another process
(a running bot, in WAL mode) writes.  It is written to a temporary name and
renamed into place, so a backup file that exists is always whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import StoreError
from .migrations import MIGRATIONS, Migration, missing_migrations, schema_version

__all__ = [
    "CheckReport",
    "backup_before_migrating",
    "backup_database",
    "check_database",
    "pending_migrations",
    "pre_migration_backup_path",
    "read_schema_version",
    "vacuum_database",
]

log = logging.getLogger(__name__)

#: How long a command waits for a busy database (a running bot's write) before giving up.
BUSY_TIMEOUT_MS = 30_000


def _stamp(now: float | None = None) -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))


def pre_migration_backup_path(path: str, version: int, now: float | None = None) -> str:
    """``<db>.pre-v<N>-<UTC timestamp>.bak``: the copy taken before migrating to version ``N``."""
    base = f"{path}.pre-v{version}-{_stamp(now)}"
    candidate, n = f"{base}.bak", 1
    while os.path.exists(candidate):  # two migrations within one second
        n += 1
        candidate = f"{base}-{n}.bak"
    return candidate


def _copy(source: sqlite3.Connection, target_path: str) -> None:
    """The whole of ``source`` into a new file at ``target_path`` (never over an existing one)."""
    if os.path.exists(target_path):
        raise StoreError(f"{target_path}: already exists; not overwriting it")
    tmp = f"{target_path}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as dest:
            source.backup(dest)  # pages=-1: one step, one consistent snapshot
            # The copy stands alone: a rollback journal, not WAL (no -wal/-shm beside it).
            dest.execute("PRAGMA journal_mode = DELETE")
        os.replace(tmp, target_path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def backup_before_migrating(
    conn: sqlite3.Connection, path: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> str | None:
    """Copy an existing database that is about to be migrated; return the copy's path.

    Nothing for a blank database (version 0: there is nothing to lose), for
    one already at the latest version, or for ``:memory:``.  A backup that
    cannot be written stops the migration (raises :class:`StoreError`).
    """
    if path == ":memory:" or not path:
        return None
    current = schema_version(conn)
    latest = max((m.number for m in migrations), default=0)
    if current == 0 or not missing_migrations(conn, migrations):
        return None
    target = pre_migration_backup_path(path, latest)
    try:
        _copy(conn, target)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(
            f"cannot back up {path!r} before migrating it from schema version {current} to"
            f" {latest} (to {target!r}): {exc}; nothing was migrated"
        ) from exc
    log.warning(
        "database %s: schema version %d, migrating to %d; backup of the old one written to %s",
        path,
        current,
        latest,
        target,
    )
    return target


@contextlib.contextmanager
def _open(path: str, *, read_only: bool = False) -> Iterator[sqlite3.Connection]:
    if not os.path.exists(path):
        raise StoreError(f"no database at {path}")
    uri = Path(path).absolute().as_uri()  # percent-encoded: '?' or '#' in a name stay a name
    if read_only:
        # Without a -wal file beside it nobody is writing and everything is in
        # the main file: read it as immutable, so not even -shm/-wal files are
        # created.  With one (a running bot), read-only through the WAL.
        wal = os.path.exists(f"{path}-wal")
        uri += "?mode=ro" if wal else "?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot open: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        yield conn
    finally:
        conn.close()


def backup_database(path: str, target: str | None = None) -> str:
    """A consistent copy of the database at ``path`` (default ``<db>.backup-<UTC time>.db``)."""
    target = target or f"{path}.backup-{_stamp()}.db"
    with _open(path) as conn:
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            _copy(conn, target)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: backup to {target} failed: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"{path}: cannot write the backup {target}: {exc}") from exc
    return target


def read_schema_version(path: str) -> int:
    """The schema version of the file at ``path``, read without writing anything."""
    with _open(path, read_only=True) as conn:
        try:
            return schema_version(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot read the schema version: {exc}") from exc


def pending_migrations(
    path: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> tuple[int, list[Migration]]:
    """The file's schema version and the migrations opening it would apply (in order).

    Reads only (a read-only connection): the file is not changed.
    """
    with _open(path, read_only=True) as conn:
        try:
            return schema_version(conn), missing_migrations(conn, migrations)
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: cannot read the schema version: {exc}") from exc


@dataclass
class CheckReport:
    """What :func:`check_database` found: ``problems`` empty means healthy."""

    path: str
    version: int = 0
    latest: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_database(path: str, migrations: tuple[Migration, ...] = MIGRATIONS) -> CheckReport:
    """``PRAGMA integrity_check``, ``PRAGMA foreign_key_check`` and the schema version."""
    latest = max((m.number for m in migrations), default=0)
    report = CheckReport(path, latest=latest)
    with _open(path, read_only=True) as conn:
        try:
            report.version = schema_version(conn)
        except sqlite3.DatabaseError as exc:
            report.problems.append(f"not a readable SQLite database: {exc}")
            return report
        try:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check(100)")]
        except sqlite3.DatabaseError as exc:
            report.problems.append(f"integrity check failed: {exc}")
            rows = []
        if rows and rows != ["ok"]:
            report.problems += [f"integrity: {r}" for r in rows]
        try:
            bad = conn.execute("PRAGMA foreign_key_check").fetchall()
        except sqlite3.DatabaseError as exc:
            report.problems.append(f"foreign key check failed: {exc}")
            bad = []
        for table, rowid, parent, _ in bad[:100]:
            report.problems.append(
                f"foreign key: {table} row {rowid} refers to a missing {parent} row"
            )
        if len(bad) > 100:
            report.problems.append(f"foreign key: … and {len(bad) - 100} more rows")
    if report.version > latest:
        report.problems.append(
            f"schema version {report.version} is newer than this agentik knows ({latest})"
        )
    elif report.version == 0:
        report.problems.append("no agentik schema (schema_migrations) in this file")
    elif report.version < latest:
        report.notes.append(
            f"schema version {report.version} of {latest}: the next start migrates it"
            " (agentik db migrate --dry-run lists the steps)"
        )
    return report


def vacuum_database(path: str) -> tuple[int, int]:
    """``VACUUM`` the file; returns its size before and after, in bytes."""
    before = os.path.getsize(path) if os.path.exists(path) else 0
    with _open(path) as conn:
        try:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: vacuum failed: {exc}") from exc
    return before, os.path.getsize(path)
