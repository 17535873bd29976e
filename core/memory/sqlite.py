"""Long-term memory in the conversations' SQLite database, searched with FTS5.

The tables (``memory_note``, ``memory_version``, ``memory_fts``) come with
the store's migrations, so memory lives in the same file as the
conversations and is backed up with them.  Writes go through the store's
single writer (:meth:`SQLiteStore.run_write`: ordered, group-committed, one
transaction each), reads through its reading connection.

Search: the query's words are matched as FTS5 terms (any word may match;
notes with more and rarer matches rank first, by ``bm25``), so a model's
loose query such as "what colour does alice like" still finds
"alice's favourite colour is teal".  The visible scopes are part of the
FTS query (each scope is one token in an indexed ``scope_key`` column), so
the index intersects words and scopes: searching one channel's notes costs
about the same however many notes other channels hold.
"""

from __future__ import annotations

import builtins
import hashlib
import re
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from ..store.sqlite import SQLiteStore
from . import MemoryBackend, Note, NoteError, NoteVersion, valid_scope

__all__ = ["SQLiteMemory", "fts_query"]

_COLUMNS = "id, scope, text, author, version, deleted, created_at, updated_at"
_WORD = re.compile(r"\w+", re.UNICODE)


def _note(row: Sequence[Any]) -> Note:
    return Note(
        id=row[0],
        scope=row[1],
        text=row[2],
        author=row[3],
        version=row[4],
        deleted=bool(row[5]),
        created_at=row[6],
        updated_at=row[7],
    )


def scope_key(scope: str) -> str:
    """The single FTS token that stands for ``scope`` in the index."""
    return "s" + hashlib.sha1(scope.encode("utf-8")).hexdigest()[:24]


def fts_query(query: str, scopes: Sequence[str] | None = None) -> str | None:
    """An FTS5 expression matching any of ``query``'s words (``None``: no words),
    restricted to ``scopes`` when given.

    Each word is quoted, so FTS5 operators and punctuation in user text are
    never interpreted.
    """
    words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))[:32]
    if not words:
        return None
    match = " OR ".join(f'"{w}"' for w in words)
    if scopes is None:
        return match
    keys = " OR ".join(f"scope_key:{scope_key(s)}" for s in dict.fromkeys(scopes))
    return f"({match}) AND ({keys})"


class SQLiteMemory(MemoryBackend):
    """Notes in ``store``'s database (the agent's :class:`SQLiteStore`)."""

    name = "sqlite"

    def __init__(self, store: SQLiteStore, *, allow_global_writes: bool = True) -> None:
        super().__init__(allow_global_writes=allow_global_writes)
        self.store = store

    # -- writes (run in the store's writer thread) ---------------------------------------
    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        valid_scope(scope)
        text = self.scrub(text)
        now = time.time()

        def fn(conn: sqlite3.Connection) -> Note:
            if note_id is None:
                cur = conn.execute(
                    "INSERT INTO memory_note (scope, scope_key, text, author, version, deleted,"
                    " created_at, updated_at) VALUES (?, ?, ?, ?, 1, 0, ?, ?)",
                    (scope, scope_key(scope), text, author, now, now),
                )
                nid, version, op = int(cur.lastrowid or 0), 1, "save"
            else:
                row = conn.execute(
                    "SELECT version FROM memory_note WHERE id = ?", (note_id,)
                ).fetchone()
                if row is None:
                    raise NoteError(f"no note #{note_id}")
                nid, version, op = note_id, int(row[0]) + 1, "edit"
                conn.execute(
                    "UPDATE memory_note SET text = ?, author = ?, version = ?, deleted = 0,"
                    " updated_at = ? WHERE id = ?",
                    (text, author, version, now, nid),
                )
            conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (nid, version, text, op, author, now),
            )
            return _note(
                conn.execute(f"SELECT {_COLUMNS} FROM memory_note WHERE id = ?", (nid,)).fetchone()
            )

        return await self._write(fn)

    async def delete(self, note_id: int, *, author: str | None = None) -> bool:
        now = time.time()

        def fn(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT version, text, deleted FROM memory_note WHERE id = ?", (note_id,)
            ).fetchone()
            if row is None or row[2]:
                return False
            version = int(row[0]) + 1
            conn.execute(
                "UPDATE memory_note SET deleted = 1, version = ?, updated_at = ? WHERE id = ?",
                (version, now, note_id),
            )
            conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES (?, ?, ?, 'delete', ?, ?)",
                (note_id, version, row[1], author, now),
            )
            return True

        return bool(await self._write(fn))

    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        now = time.time()

        def fn(conn: sqlite3.Connection) -> Note:
            old = conn.execute(
                "SELECT text FROM memory_version WHERE note_id = ? AND version = ?",
                (note_id, version),
            ).fetchone()
            cur = conn.execute("SELECT version FROM memory_note WHERE id = ?", (note_id,))
            row = cur.fetchone()
            if row is None or old is None:
                raise NoteError(f"note #{note_id} has no version {version}")
            new = int(row[0]) + 1
            conn.execute(
                "UPDATE memory_note SET text = ?, author = ?, version = ?, deleted = 0,"
                " updated_at = ? WHERE id = ?",
                (old[0], author, new, now, note_id),
            )
            conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES (?, ?, ?, 'restore', ?, ?)",
                (note_id, new, old[0], author, now),
            )
            return _note(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM memory_note WHERE id = ?", (note_id,)
                ).fetchone()
            )

        return await self._write(fn)

    async def purge(self, note_id: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM memory_note WHERE id = ?", (note_id,)).rowcount > 0

        return bool(await self._write(fn))

    async def _write(self, fn: Any) -> Any:
        try:
            return await self.store.run_write(fn)
        except NoteError:
            raise
        except Exception as exc:
            cause = exc.__cause__
            if isinstance(cause, NoteError):
                raise cause from None
            raise

    # -- reads -----------------------------------------------------------------------
    async def get(self, note_id: int, *, include_deleted: bool = False) -> Note | None:
        rows = await self.store.run_read(
            f"SELECT {_COLUMNS} FROM memory_note WHERE id = ?", (note_id,)
        )
        if not rows:
            return None
        note = _note(rows[0])
        return note if include_deleted or not note.deleted else None

    async def list(
        self,
        scopes: Sequence[str] | None = None,
        *,
        limit: int = 50,
        offset: int = 0,
        include_deleted: bool = False,
    ) -> builtins.list[Note]:
        where: list[str] = []
        params: list[Any] = []
        if scopes is not None:
            if not scopes:
                return []
            where.append(f"scope IN ({', '.join('?' * len(scopes))})")
            params.extend(scopes)
        if not include_deleted:
            where.append("deleted = 0")
        cond = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self.store.run_read(
            f"SELECT {_COLUMNS} FROM memory_note {cond}"
            " ORDER BY updated_at DESC, id DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [_note(r) for r in rows]

    async def search(
        self, query: str, scopes: Sequence[str] | None = None, *, limit: int = 10
    ) -> builtins.list[Note]:
        if scopes is not None and not scopes:
            return []
        match = fts_query(query, scopes)
        if match is None:
            return []
        where = ["memory_fts MATCH ?", "n.deleted = 0"]
        params: list[Any] = [match]
        if scopes is not None:
            where.append(f"n.scope IN ({', '.join('?' * len(scopes))})")
            params.extend(scopes)
        cols = ", ".join(f"n.{c.strip()}" for c in _COLUMNS.split(","))
        rows = await self.store.run_read(
            f"SELECT {cols} FROM memory_fts JOIN memory_note n ON n.id = memory_fts.rowid"
            f" WHERE {' AND '.join(where)} ORDER BY bm25(memory_fts, 1.0, 0.0), n.id DESC LIMIT ?",
            (*params, limit),
        )
        return [_note(r) for r in rows]

    async def history(self, note_id: int) -> builtins.list[NoteVersion]:
        rows = await self.store.run_read(
            "SELECT note_id, version, text, op, author, created_at FROM memory_version"
            " WHERE note_id = ? ORDER BY version",
            (note_id,),
        )
        return [
            NoteVersion(
                note_id=r[0], version=r[1], text=r[2], op=r[3], author=r[4], created_at=r[5]
            )
            for r in rows
        ]
