"""Long-term memory in the conversations' PostgreSQL database.

What :class:`~.sqlite.SQLiteMemory` does, on the tables of the PostgreSQL store's
migration 4 (``memory_note``, ``memory_version``, ``memory_vector``,
``memory_source``): the notes live beside the conversations, every process of
the bot (every worker) sees the same notes, and writes go through the store's
ordered writer (one transaction each, group-committed).  The ranking is
SQLite's own code (this class inherits it): hybrid search fuses a full-text
ranking and a vector ranking; recall holds the cosine threshold.

Full text: each note's words are cut and folded in Python as SQLite's FTS5
tokenizer (``unicode61 remove_diacritics 2``) does (:func:`words`: letters and
digits, lower case, accents removed) and stored as a ``tsvector`` with their
positions (``tsv``, a GIN index) and their count (``words``); a trigger keeps the
totals bm25 needs (``memory_totals``: notes and words; ``memory_word``: in how many
notes each word is), as FTS5 keeps them in its index.  No text search
configuration nor the database's locale decides what a word is (a database
created with ``--locale=C`` does not lower-case ``É`` in SQL), and no word is
dropped as a stop word: any language is searched as SQLite searches it.  A
query matches any of its words (``|``), within the visible scopes, ranked by
the same bm25 as FTS5's (``k1`` 1.2, ``b`` 0.75, the idf of each word over every
note), computed in SQL.

Vectors: pgvector is not used.  The embeddings are stored as little-endian
``float32`` in a ``bytea`` column and each process ranks them in memory with
:class:`~.vectors.VectorIndex` (exact cosine), catching up with other processes'
writes by ``seq`` at most once per ``sync_interval``, and reading an idle scope's
vectors back when it is searched again, as SQLite does.  Every
memory write takes an advisory lock (:data:`MEMORY_LOCK`) first and holds it
until it commits, so vectors become visible in ``seq`` order (a process that read
up to ``seq`` N has seen every row below it, even with several workers writing)
and the counts' rows are never locked in opposite orders.
"""

from __future__ import annotations

import builtins
import logging
import re
import time
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..store.postgres_migrations import MEMORY_LOCK_KEY
from ..store.postgres_room import nul_free
from . import Note, NoteError, NoteVersion, RecallPolicy, valid_scope
from .embeddings import Embedder
from .sqlite import RELEASE_AFTER, SYNC_INTERVAL, SearchMode, SQLiteMemory, vector_blob

if TYPE_CHECKING:
    import asyncpg
    import numpy as np

    from ..store.postgres import PostgresStore

__all__ = ["PostgresMemory", "query_words", "tsvector", "words"]

log = logging.getLogger(__name__)

_COLUMNS = "id, scope, text, author, version, deleted, created_at, updated_at"
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
#: The advisory lock every memory write takes first and holds to its commit ("agentikm"):
#: writes of notes are ordered across processes (vectors commit in ``seq`` order; the
#: bm25 counts' rows are locked by one writer at a time, never in opposite orders).
MEMORY_LOCK = MEMORY_LOCK_KEY


async def _lock(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock($1)", MEMORY_LOCK)


#: PostgreSQL's limits: positions 1..16383, 256 of them per word, words < 2 KB.
_MAX_POS = 16383
_MAX_POSITIONS = 256
_MAX_WORD = 200
#: At most this many of a query's words are searched for (as SQLite's :func:`fts_query`).
_QUERY_WORDS = 32


def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def words(text: str) -> list[str]:
    """``text``'s words as the full-text index holds them: runs of letters and
    digits, lower case, without accents (``Café`` is ``cafe``)."""
    return [w for w in _TOKEN.findall(_fold(text)) if len(w) <= _MAX_WORD]


def tsvector(text: str) -> tuple[str, int]:
    """``text`` as a ``tsvector`` literal (each word with its positions) and its
    number of words."""
    positions: dict[str, list[int]] = {}
    found = words(text)
    for pos, word in enumerate(found, start=1):
        seen = positions.setdefault(word, [])
        if len(seen) < _MAX_POSITIONS:
            seen.append(min(pos, _MAX_POS))
    literal = " ".join(
        f"'{w}':{','.join(str(p) for p in dict.fromkeys(ps))}" for w, ps in positions.items()
    )
    return literal, len(found)


def query_words(query: str) -> list[str]:
    """The distinct words of ``query`` searched for (at most 32, as SQLite's
    :func:`~.sqlite.fts_query`): a note matches if it has any of them."""
    return list(dict.fromkeys(words(query)))[:_QUERY_WORDS]


def _note(row: Sequence[Any]) -> Note:
    return Note(
        id=int(row[0]),
        scope=row[1],
        text=row[2],
        author=row[3],
        version=int(row[4]),
        deleted=bool(row[5]),
        created_at=float(row[6]),
        updated_at=float(row[7]),
    )


#: bm25 as FTS5 computes it (k1 = 1.2, b = 0.75; idf over every note, at least 1e-6)
#: for the notes matching any of the words ``$1`` (the tsquery ``$2``), in the scopes
#: ``$3`` (:data:`_BM25_ALL`: in every scope): the totals and each word's number of
#: notes are read from ``memory_totals`` and ``memory_word`` (kept by triggers, as
#: FTS5 keeps them in its index).
_BM25 = f"""
WITH total AS (
    SELECT COALESCE(sum(notes), 0)::float8 AS n,
           COALESCE(sum(words)::float8 / NULLIF(sum(notes), 0), 0) AS avgdl
    FROM memory_totals
), idf AS (
    SELECT q.w, GREATEST(ln((total.n - COALESCE(mw.notes, 0) + 0.5)
                            / (COALESCE(mw.notes, 0) + 0.5)), 1e-6) AS idf
    FROM unnest($1::text[]) AS q(w) CROSS JOIN total
    LEFT JOIN memory_word mw ON mw.lexeme = q.w
), hit AS (
    SELECT {_COLUMNS}, tsv, words FROM memory_note
    WHERE tsv @@ $2::tsquery AND NOT deleted AND scope = ANY($3::text[])
)
SELECT hit.id, hit.scope, hit.text, hit.author, hit.version, hit.deleted, hit.created_at,
       hit.updated_at,
       SUM(idf.idf * (u.tf * 2.2)
           / (u.tf + 1.2 * (0.25 + 0.75 * hit.words / GREATEST(total.avgdl, 1e-9)))) AS score
FROM hit CROSS JOIN total
CROSS JOIN LATERAL (
    -- Only the query's words of the note (marked, then kept: C functions, cheaper
    -- than unnesting every word of every matching note).
    SELECT lexeme, COALESCE(array_length(positions, 1), 1)::float8 AS tf
    FROM unnest(ts_filter(setweight(hit.tsv, 'A', $1::text[]), '{{a}}'))
) u
JOIN idf ON idf.w = u.lexeme
GROUP BY hit.id, hit.scope, hit.text, hit.author, hit.version, hit.deleted, hit.created_at,
         hit.updated_at
ORDER BY score DESC, hit.id DESC
LIMIT $4
"""


#: :data:`_BM25` over every scope (a statement of its own: no ``$3 IS NULL OR`` that
#: would keep a prepared plan from using the scope index).
_BM25_ALL = _BM25.replace(" AND scope = ANY($3::text[])", " AND $3::text[] IS NULL")


class PostgresMemory(SQLiteMemory):
    """Notes in ``store``'s database (the agent's
    :class:`~agentik.core.store.postgres.PostgresStore`).

    The arguments are :class:`~.sqlite.SQLiteMemory`'s: ``embedder`` (``None``:
    full text only), ``search`` (``hybrid``, ``fts`` or ``vector``), ``recall``,
    ``sync_interval`` (how stale this process's copy of other processes'
    vectors may get), ``release_after`` (seconds a scope's vectors stay in
    memory unused).
    """

    name = "postgres"

    def __init__(
        self,
        store: PostgresStore,
        *,
        allow_global_writes: bool = False,
        embedder: Embedder | None = None,
        search: SearchMode = "hybrid",
        recall: RecallPolicy | None = None,
        sync_interval: float = SYNC_INTERVAL,
        release_after: float = RELEASE_AFTER,
    ) -> None:
        super().__init__(
            store,  # type: ignore[arg-type]  # what reads it is overridden or engine-neutral SQL
            allow_global_writes=allow_global_writes,
            embedder=embedder,
            search=search,
            recall=recall,
            sync_interval=sync_interval,
            release_after=release_after,
        )
        self.pg = store

    # -- vectors (check_vectors: the SQLite memory's SQL runs here as it is) ----------

    async def _put_vector(self, conn: asyncpg.Connection, nid: int, vector: Any) -> None:
        """In the writer's transaction, under :data:`MEMORY_LOCK`: the note's vector
        written (a new ``seq``), or removed when ``vector`` is ``None``."""
        if vector is None or self.embedder is None:
            await conn.execute("DELETE FROM memory_vector WHERE note_id = $1", nid)
            return
        await conn.execute(
            "INSERT INTO memory_vector (note_id, seq, model, dim, vector)"
            " VALUES ($1, nextval('memory_vector_seq'), $2, $3, $4)"
            " ON CONFLICT (note_id) DO UPDATE SET seq = excluded.seq, model = excluded.model,"
            " dim = excluded.dim, vector = excluded.vector",
            nid,
            self.embedder.model,
            int(vector.shape[0]),
            vector_blob(vector),
        )

    async def _vectors_since(self, seq: int) -> Sequence[Sequence[Any]]:
        return await self.pg.run_read(
            "SELECT v.seq, v.note_id, n.scope, v.model, v.dim, v.vector FROM memory_vector v"
            " JOIN memory_note n ON n.id = v.note_id WHERE v.seq > $1 ORDER BY v.seq",
            seq,
        )

    async def _vectors_in(self, scopes: Sequence[str]) -> Sequence[Sequence[Any]]:
        return await self.pg.run_read(
            "SELECT v.note_id, n.scope, v.model, v.vector FROM memory_note n"
            " JOIN memory_vector v ON v.note_id = n.id WHERE n.scope = ANY($1::text[])",
            list(scopes),
        )

    async def reembed(self, *, everything: bool = False, batch: int = 256) -> int:
        if self.embedder is None:
            raise NoteError("no embedding model is configured ([memory] embeddings)")
        model = self.embedder.model
        if everything:
            rows = await self.pg.run_read(
                "SELECT id, text FROM memory_note WHERE NOT deleted ORDER BY id"
            )
        else:
            rows = await self.pg.run_read(
                "SELECT n.id, n.text FROM memory_note n"
                " LEFT JOIN memory_vector v ON v.note_id = n.id WHERE NOT n.deleted"
                " AND (v.note_id IS NULL OR v.model != $1 OR v.dim != $2) ORDER BY n.id",
                model,
                self.embedder.dim or -1,
            )
        done = 0
        for start in range(0, len(rows), batch):
            chunk = [(int(r[0]), str(r[1])) for r in rows[start : start + batch]]
            vectors = await self.embedder.embed([text for _, text in chunk])

            async def fn(
                conn: asyncpg.Connection, chunk: Any = chunk, vectors: Any = vectors
            ) -> None:
                await _lock(conn)
                for (nid, text), vec in zip(chunk, vectors, strict=True):
                    # Only if the text did not change meanwhile (an edit embeds itself).
                    now = await conn.fetchval(
                        "SELECT text FROM memory_note WHERE id = $1 AND NOT deleted", nid
                    )
                    if now == text:
                        await self._put_vector(conn, nid, vec)

            await self._write(fn)
            done += len(chunk)

        async def clean(conn: asyncpg.Connection) -> None:
            await _lock(conn)
            await conn.execute(
                "DELETE FROM memory_vector WHERE model != $1"
                " OR note_id IN (SELECT id FROM memory_note WHERE deleted)",
                model,
            )

        await self._write(clean)
        self._index, self._seq, self._synced_at = None, 0, float("-inf")
        self._counted = False
        await self.check_vectors()
        return done

    # -- writes (in the store's writer, one transaction each) ---------------------------
    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        valid_scope(scope)
        text = nul_free(self.scrub(text)) or ""
        author = nul_free(author)
        now = time.time()
        vector = await self._embed(text)
        tsv, count = tsvector(text)

        async def fn(conn: asyncpg.Connection) -> Note:
            await _lock(conn)
            if note_id is None:
                new_id = await conn.fetchval(
                    "INSERT INTO memory_note (scope, text, author, version, deleted,"
                    " created_at, updated_at, tsv, words)"
                    " VALUES ($1, $2, $3, 1, false, $4, $4, $5::tsvector, $6) RETURNING id",
                    scope, text, author, now, tsv, count,
                )  # fmt: skip
                nid, version, op = int(new_id), 1, "save"
            else:
                old = await conn.fetchval(
                    "SELECT version FROM memory_note WHERE id = $1 FOR UPDATE", note_id
                )
                if old is None:
                    raise NoteError(f"no note #{note_id}")
                nid, version, op = note_id, int(old) + 1, "edit"
                await conn.execute(
                    "UPDATE memory_note SET text = $1, author = $2, version = $3, deleted = false,"
                    " updated_at = $4, tsv = $5::tsvector, words = $6 WHERE id = $7",
                    text, author, version, now, tsv, count, nid,
                )  # fmt: skip
            await conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES ($1, $2, $3, $4, $5, $6)",
                nid, version, text, op, author, now,
            )  # fmt: skip
            await self._put_vector(conn, nid, vector)
            return _note(
                await conn.fetchrow(f"SELECT {_COLUMNS} FROM memory_note WHERE id = $1", nid)
            )

        note: Note = await self._write(fn)
        self._after_write(note.id, note.scope, vector)
        return note

    async def delete(self, note_id: int, *, author: str | None = None) -> bool:
        now = time.time()
        author = nul_free(author)

        async def fn(conn: asyncpg.Connection) -> bool:
            await _lock(conn)
            row = await conn.fetchrow(
                "SELECT version, text, deleted FROM memory_note WHERE id = $1 FOR UPDATE", note_id
            )
            if row is None or row[2]:
                return False
            version = int(row[0]) + 1
            await conn.execute(
                "UPDATE memory_note SET deleted = true, version = $1, updated_at = $2"
                " WHERE id = $3",
                version, now, note_id,
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES ($1, $2, $3, 'delete', $4, $5)",
                note_id, version, row[1], author, now,
            )  # fmt: skip
            await conn.execute("DELETE FROM memory_vector WHERE note_id = $1", note_id)
            return True

        deleted = bool(await self._write(fn))
        if deleted and self._index is not None:
            self._index.remove(note_id)
        return deleted

    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        now = time.time()
        author = nul_free(author)
        vector: np.ndarray | None = None
        if self.embedder is not None:
            old_rows = await self.pg.run_read(
                "SELECT text FROM memory_version WHERE note_id = $1 AND version = $2",
                note_id,
                version,
            )
            if old_rows:
                vector = await self._embed(old_rows[0][0])

        async def fn(conn: asyncpg.Connection) -> Note:
            await _lock(conn)
            old = await conn.fetchval(
                "SELECT text FROM memory_version WHERE note_id = $1 AND version = $2",
                note_id,
                version,
            )
            current = await conn.fetchval(
                "SELECT version FROM memory_note WHERE id = $1 FOR UPDATE", note_id
            )
            if current is None or old is None:
                raise NoteError(f"note #{note_id} has no version {version}")
            new = int(current) + 1
            tsv, count = tsvector(old)
            await conn.execute(
                "UPDATE memory_note SET text = $1, author = $2, version = $3, deleted = false,"
                " updated_at = $4, tsv = $5::tsvector, words = $6 WHERE id = $7",
                old, author, new, now, tsv, count, note_id,
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO memory_version (note_id, version, text, op, author, created_at)"
                " VALUES ($1, $2, $3, 'restore', $4, $5)",
                note_id, new, old, author, now,
            )  # fmt: skip
            await self._put_vector(conn, note_id, vector)
            return _note(
                await conn.fetchrow(f"SELECT {_COLUMNS} FROM memory_note WHERE id = $1", note_id)
            )

        note: Note = await self._write(fn)
        self._after_write(note.id, note.scope, vector)
        return note

    async def purge(self, note_id: int) -> bool:
        async def fn(conn: asyncpg.Connection) -> bool:
            await _lock(conn)
            status = await conn.execute("DELETE FROM memory_note WHERE id = $1", note_id)
            return bool(status != "DELETE 0")

        purged = bool(await self._write(fn))
        if self._index is not None:
            self._index.remove(note_id)
        return purged

    # -- reads -----------------------------------------------------------------------
    async def get(self, note_id: int, *, include_deleted: bool = False) -> Note | None:
        rows = await self.pg.run_read(f"SELECT {_COLUMNS} FROM memory_note WHERE id = $1", note_id)
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
        if scopes is not None and not scopes:
            return []
        where = ["NOT deleted"] if not include_deleted else []
        args: builtins.list[Any] = []
        if scopes is not None:
            args.append(builtins.list(scopes))
            where.append("scope = ANY($1::text[])")
        cond = f"WHERE {' AND '.join(where)}" if where else ""
        n = len(args)
        rows = await self.pg.run_read(
            f"SELECT {_COLUMNS} FROM memory_note {cond}"
            f" ORDER BY updated_at DESC, id DESC LIMIT ${n + 1} OFFSET ${n + 2}",
            *args,
            limit,
            offset,
        )
        return [_note(r) for r in rows]

    async def _notes(
        self, ranked: Sequence[tuple[int, float]], scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[tuple[Note, float]]:
        out: list[tuple[Note, float]] = []
        pos = 0
        wanted = None if scopes is None else builtins.list(scopes)
        while len(out) < limit and pos < len(ranked):
            chunk = ranked[pos : pos + max(limit * 2, 16)]
            pos += len(chunk)
            ids = [nid for nid, _ in chunk]
            sql = f"SELECT {_COLUMNS} FROM memory_note WHERE id = ANY($1::bigint[]) AND NOT deleted"
            if wanted is None:
                rows = await self.pg.run_read(sql, ids)
            else:
                rows = await self.pg.run_read(sql + " AND scope = ANY($2::text[])", ids, wanted)
            found = {int(r[0]): _note(r) for r in rows}
            for nid, score in chunk:
                if nid in found and len(out) < limit:
                    out.append((found[nid], score))
        return out

    async def _bm25(
        self, terms: Sequence[str], scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[tuple[Note, float]]:
        if not terms or (scopes is not None and not scopes):
            return []
        rows = await self.pg.run_read(
            _BM25_ALL if scopes is None else _BM25,
            builtins.list(terms),
            " | ".join(f"'{w}'" for w in terms),
            None if scopes is None else builtins.list(scopes),
            limit,
        )
        return [(_note(r[:8]), float(r[8])) for r in rows]

    async def _fts_ids(
        self, query: str, scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[int]:
        # ``query`` comes without stop words already (content_words).
        return [n.id for n, _ in await self._bm25(query_words(query), scopes, limit)]

    async def _fts(
        self, query: str, scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[tuple[Note, float]]:
        return await self._bm25(query_words(query), scopes, limit)

    async def history(self, note_id: int) -> builtins.list[NoteVersion]:
        rows = await self.pg.run_read(
            "SELECT note_id, version, text, op, author, created_at FROM memory_version"
            " WHERE note_id = $1 ORDER BY version",
            note_id,
        )
        return [
            NoteVersion(
                note_id=int(r[0]),
                version=int(r[1]),
                text=r[2],
                op=r[3],
                author=r[4],
                created_at=float(r[5]),
            )
            for r in rows
        ]
