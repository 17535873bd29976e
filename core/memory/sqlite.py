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

Semantic search (with an :class:`~.embeddings.Embedder`): every saved,
edited or restored note is embedded and its vector written in the same
transaction (``memory_vector``); a deleted note's vector is removed.  The
process searches a copy of the vectors in memory (:class:`~.vectors.VectorIndex`,
exact cosine by numpy).  Its own writes go into that copy as they commit;
vectors other processes wrote (``agentik memory add``, another worker) are
caught up with (by their ``seq``) before a search, at most once every
``sync_interval`` seconds (:data:`SYNC_INTERVAL`, one second): another
process's note is found within a second of its commit, and a busy bot does
not read the vector table on every message.  The copy keeps the scopes in use:
a scope (a channel's notes, a user's) that no search and no note used for
``release_after`` seconds (:data:`RELEASE_AFTER`, the ``[memory]
release_vectors_after_idle`` setting) leaves memory, and its vectors are read
back from the database (one indexed read) by its next search.  So the memory
a bot holds for vectors follows the channels that talk, not every note it
ever learned.  ``search="hybrid"`` (the default with an
embedder) fuses the FTS5 ranking and the vector ranking by reciprocal-rank
fusion, so a paraphrase that shares no word with the note ("where do we
deploy?" → "production runs on the Hetzner box") is found, and an exact word
(a name, an error code) still counts.  Vectors from another model than the
configured one (a changed ``[memory] embeddings``) are detected at start:
the search falls back to FTS and the log says to run ``agentik memory
reembed``.

Nothing is computed that cannot find anything: when the visible scopes hold
no vector (a new bot, a channel without notes), recall returns at once
without embedding the message, so the embedding model (and numpy) are not
even loaded until the first note is saved or searched for.  A text's vector
is kept for a while (the last :data:`EMBED_CACHE` texts), so a turn's message
is embedded once for recall and a ``memory_search`` of the same text.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import logging
import re
import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..store.sqlite import SQLiteStore
from . import MemoryBackend, Note, NoteError, NoteVersion, RecallPolicy, valid_scope
from .embeddings import Embedder, EmbeddingError

if TYPE_CHECKING:
    import numpy as np

    from .vectors import VectorIndex

__all__ = ["SQLiteMemory", "SearchMode", "blob_vector", "fts_query", "rrf", "vector_blob"]

log = logging.getLogger(__name__)

SearchMode = Literal["hybrid", "fts", "vector"]

#: The ``k`` of reciprocal-rank fusion: a document's fused score is the sum of
#: ``1 / (RRF_K + rank)`` over the rankings it appears in (rank from 1).
RRF_K = 60
#: How many candidates each ranking contributes to the fusion (at least).
CANDIDATES = 50
#: Seconds a search may go without reading the vectors other processes wrote
#: (this process's own writes are in its copy at once).
SYNC_INTERVAL = 1.0
#: How many texts' vectors are kept for reuse (a turn's message: recall, then
#: a ``memory_search`` of the same words), most recently used first.
EMBED_CACHE = 64
#: Seconds a scope's vectors stay in memory after the last search or note in
#: it (then they are read back from the database when needed; 0: kept for good).
RELEASE_AFTER = 900.0

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


#: Common English function words, left out of the full-text half of a hybrid
#: search: matched as FTS terms ("where", "do", "we") they rank notes that
#: share only them with the question above the vector ranking's good matches.
#: (``search = "fts"`` keeps every word, as before.)
STOPWORDS = frozenset(
    """a an the and or but if of at by for with about against between into through
    during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most
    other some such no nor not only own same so than too very can will just should
    now is are was were be been being have has had having do does did doing i me my
    we our us you your he him his she her it its they them their what which who whom
    this that these those am would could let s t don""".split()
)


def content_words(query: str) -> str:
    """``query`` without :data:`STOPWORDS` (the words joined by spaces)."""
    return " ".join(w for w in _WORD.findall(query) if w.lower() not in STOPWORDS)


def rrf(*rankings: Sequence[int], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of ``rankings`` (ids, best first): ``(id, score)``, best first.

    Ties keep the order of first appearance (the first ranking's first).
    """
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, nid in enumerate(ranking, start=1):
            scores[nid] = scores.get(nid, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def vector_blob(vector: np.ndarray) -> bytes:
    """An embedding as stored (little-endian float32 bytes), on every engine."""
    import numpy as np

    return np.asarray(vector, dtype="<f4").tobytes()


def blob_matrix(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """Stored embeddings of ``dim`` floats each, one row per blob (one copy in all)."""
    import numpy as np

    return np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim)


def blob_vector(blob: bytes, dim: int) -> np.ndarray | None:
    """The embedding of a stored blob; ``None`` when it is not ``dim`` floats."""
    import numpy as np

    arr = np.frombuffer(blob, dtype="<f4")
    return arr.astype(np.float32) if arr.shape[0] == dim else None


class SQLiteMemory(MemoryBackend):
    """Notes in ``store``'s database (the agent's :class:`SQLiteStore`).

    ``embedder``: embeds notes for semantic search and recall (``None``: FTS5
    only, as before).  ``search``: what ``memory_search`` and :meth:`search`
    use: ``hybrid`` (FTS5 and vectors fused), ``fts`` or ``vector``; without
    an embedder, or while the stored vectors are of another model, it is FTS.
    ``recall``: automatic recall where a conversation does not say (off by
    default; the configuration's ``[memory] recall`` turns it on).
    ``sync_interval``: how stale the copy of other processes' vectors may get
    (seconds; ``0``: read before every search).  ``release_after``: seconds
    a scope's vectors stay in memory unused (``0``: for good).
    """

    name = "sqlite"

    def __init__(
        self,
        store: SQLiteStore,
        *,
        allow_global_writes: bool = False,
        embedder: Embedder | None = None,
        search: SearchMode = "hybrid",
        recall: RecallPolicy | None = None,
        sync_interval: float = SYNC_INTERVAL,
        release_after: float = RELEASE_AFTER,
    ) -> None:
        super().__init__(allow_global_writes=allow_global_writes)
        self.store = store
        self.embedder = embedder
        if recall is not None:
            self.recall_policy = recall
        self.search_mode: SearchMode = search
        self._index: VectorIndex | None = None
        self._seq = 0
        #: Whether the first catch-up (the vectors' count by scope) ran.
        self._counted = False
        self.sync_interval = sync_interval
        self.release_after = release_after
        self._release: asyncio.TimerHandle | None = None
        #: Scopes whose vectors left memory so far, and how many were read back.
        self.scopes_released = 0
        self.scopes_loaded = 0
        self._synced_at = float("-inf")
        self._sync_lock = asyncio.Lock()
        self._embedded: dict[bytes, np.ndarray] = {}
        #: Why vectors are not used now (``None``: they are, or there is no embedder).
        self.vectors_unusable: str | None = None
        self._checked = False

    # -- vectors ---------------------------------------------------------------------
    @property
    def vectors_ready(self) -> bool:
        """Whether searches use vectors (an embedder, and no model mismatch)."""
        return self.embedder is not None and self.vectors_unusable is None

    async def start(self) -> None:
        await self.check_vectors()

    async def aclose(self) -> None:
        handle, self._release = self._release, None
        if handle is not None:
            handle.cancel()

    async def check_vectors(self) -> dict[str, Any]:
        """Compare the stored vectors with the embedder's model; log a mismatch.

        Returns the counts: ``{"notes", "current", "other_models", "missing"}``.
        With vectors of another model, searches fall back to FTS until
        ``agentik memory reembed`` (:meth:`reembed`) rebuilds them.
        """
        self._checked = True
        if self.embedder is None:
            return {}
        model = self.embedder.model
        rows = await self.store.run_read(
            "SELECT v.model, v.dim, COUNT(*) FROM memory_vector v"
            " JOIN memory_note n ON n.id = v.note_id WHERE NOT n.deleted GROUP BY v.model, v.dim"
        )  # (SQL that PostgreSQL's memory, a subclass, runs as it is)
        counted = await self.store.run_read("SELECT COUNT(*) FROM memory_note WHERE NOT deleted")
        notes = int(counted[0][0])
        want = self.embedder.dim

        def same(m: str, d: int) -> bool:
            return m == model and (not want or d == want)

        current = sum(int(c) for m, d, c in rows if same(m, d))
        other = {f"{m} ({d} dimensions)": int(c) for m, d, c in rows if not same(m, d)}
        missing = notes - current - sum(other.values())
        self.vectors_unusable = None
        if other:
            names = ", ".join(f"{k}: {v} notes" for k, v in other.items())
            self.vectors_unusable = (
                f"the memory's vectors were made by another embedding model ({names}); "
                f"configured: {model}"
            )
            log.warning(
                "%s; memory search uses full-text only until you run `agentik memory reembed`",
                self.vectors_unusable,
            )
        elif missing > 0:
            log.warning(
                "%d memory notes have no vector yet (semantic search and recall skip them); "
                "run `agentik memory reembed` to embed them",
                missing,
            )
        return {"notes": notes, "current": current, "other_models": other, "missing": missing}

    async def _embed(self, text: str) -> np.ndarray | None:
        """``text``'s vector, or ``None`` (logged) when the embedder fails: the
        note is saved anyway, and ``reembed`` adds its vector later."""
        if self.embedder is None:
            return None
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        vector = self._embedded.pop(key, None)
        if vector is None:
            try:
                vector = (await self.embedder.embed([text]))[0]
            except EmbeddingError as exc:
                log.warning(
                    "note saved without a vector (%s); `agentik memory reembed` adds it", exc
                )
                return None
            vector.flags.writeable = False  # shared by every caller of the same text
            if len(self._embedded) >= EMBED_CACHE:
                del self._embedded[next(iter(self._embedded))]
        self._embedded[key] = vector  # (re)inserted last: most recently used
        return vector

    def _write_vector(self, conn: sqlite3.Connection, nid: int, vector: np.ndarray | None) -> None:
        if vector is None or self.embedder is None:
            conn.execute("DELETE FROM memory_vector WHERE note_id = ?", (nid,))
            return
        conn.execute(
            "INSERT OR REPLACE INTO memory_vector (note_id, model, dim, vector)"
            " VALUES (?, ?, ?, ?)",
            (nid, self.embedder.model, int(vector.shape[0]), vector_blob(vector)),
        )

    async def _vectors_since(self, seq: int) -> Sequence[Sequence[Any]]:
        """The vector rows written after ``seq``: ``(seq, note id, scope, model,
        dim, vector)``, in ``seq`` order."""
        # By seq alone (the primary key: a range read); the model is checked by
        # the caller (in SQL it leads the planner to scan the model index).
        return await self.store.run_read(
            "SELECT v.seq, v.note_id, n.scope, v.model, v.dim, v.vector FROM memory_vector v"
            " JOIN memory_note n ON n.id = v.note_id WHERE v.seq > ? ORDER BY v.seq",
            (seq,),
        )

    async def _vectors_in(self, scopes: Sequence[str]) -> Sequence[Sequence[Any]]:
        """The vectors of ``scopes``' notes: ``(note id, scope, model, vector)``."""
        marks = ", ".join("?" * len(scopes))
        return await self.store.run_read(
            "SELECT v.note_id, n.scope, v.model, v.vector FROM memory_note n"
            f" JOIN memory_vector v ON v.note_id = n.id WHERE n.scope IN ({marks})",
            tuple(scopes),
        )

    async def _sync(self) -> VectorIndex | None:
        """The in-memory vectors, caught up with the database (with what other
        processes wrote up to ``sync_interval`` seconds ago)."""
        if self.embedder is None:
            return None
        if not self._checked:
            await self.check_vectors()
        async with self._sync_lock:
            started = time.monotonic()
            if started - self._synced_at < self.sync_interval:
                return self._index
            if not self._counted:
                await self._count_vectors()
                self._synced_at = started
                return self._index
            rows = await self._vectors_since(self._seq)
            self._synced_at = started
            model = self.embedder.model
            for seq, nid, scope, row_model, dim, blob in rows:
                self._seq = max(self._seq, int(seq))
                if row_model != model:
                    continue
                if self._index is None:
                    from .vectors import VectorIndex

                    self._index = VectorIndex(int(dim))
                vec = blob_vector(bytes(blob), self._index.dim)
                if vec is not None:
                    self._index.put(int(nid), scope, vec)
            self._arm_release()
            return self._index

    async def _count_vectors(self) -> None:
        """The first catch-up: how many vectors each scope has, not the vectors.

        Every scope starts cold, so a bot that restarts on a database of many
        notes reads the vectors of the scopes it searches, when it does.  The
        last ``seq`` is read first: a vector written between the two reads is
        counted and read again by the next catch-up (a count may only be high).
        """
        assert self.embedder is not None
        top = await self.store.run_read("SELECT COALESCE(MAX(seq), 0) FROM memory_vector")
        rows = await self.store.run_read(
            "SELECT n.scope, v.model, v.dim, COUNT(*) FROM memory_vector v"
            " JOIN memory_note n ON n.id = v.note_id GROUP BY n.scope, v.model, v.dim"
        )  # (SQL that PostgreSQL's memory runs as it is)
        model = self.embedder.model
        dims: dict[int, int] = {}
        for _, row_model, dim, count in rows:
            if row_model == model:
                dims[int(dim)] = dims.get(int(dim), 0) + int(count)
        self._seq, self._counted = int(top[0][0]), True
        if not dims:
            return
        want = self.embedder.dim or max(dims, key=lambda d: dims[d])
        from .vectors import VectorIndex

        index = self._index = VectorIndex(want)
        for scope, row_model, dim, count in rows:
            if row_model == model and int(dim) == want:
                index.add_cold(scope, int(count))

    async def _warm(self, index: VectorIndex, scopes: Sequence[str] | None) -> None:
        """Read back the vectors of ``scopes`` (all when ``None``) that left
        memory, so that ``index.search`` sees them."""
        if self.embedder is None or not index.cold_scopes(scopes):
            return
        model = self.embedder.model
        async with self._sync_lock:  # (one read at a time, never beside a catch-up)
            cold = index.cold_scopes(scopes)
            for start in range(0, len(cold), 500):
                chunk = cold[start : start + 500]
                index.begin_load(chunk)
                try:
                    rows = await self._vectors_in(chunk)
                except BaseException:
                    index.abort_load(chunk)
                    raise
                size = index.dim * 4
                found: dict[str, tuple[list[int], list[bytes]]] = {s: ([], []) for s in chunk}
                for nid, scope, row_model, blob in rows:
                    if row_model == model and scope in found and len(blob) == size:
                        ids, blobs = found[scope]
                        ids.append(int(nid))
                        blobs.append(bytes(blob))
                for scope, (ids, blobs) in found.items():
                    index.install(scope, ids, blob_matrix(blobs, index.dim))
                self.scopes_loaded += len(chunk)
        self._arm_release()

    def _arm_release(self) -> None:
        """Schedule the release of scopes that will have gone unused for
        :attr:`release_after` seconds (when none is scheduled)."""
        index = self._index
        if self.release_after <= 0 or self._release is not None or index is None:
            return
        oldest = index.oldest_use()
        if oldest is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        # At most a few checks per period, however the uses are spread.
        step = min(self.release_after / 8, 60.0)
        delay = max(oldest + self.release_after - time.monotonic(), step)
        self._release = loop.call_later(delay, self._release_idle)

    def _release_idle(self) -> None:
        self._release = None
        index = self._index
        if index is None:
            return
        released = index.release_idle(time.monotonic() - self.release_after)
        if released:
            self.scopes_released += released
            log.debug("the vectors of %d idle memory scopes left memory", released)
            if self.on_release is not None:
                with contextlib.suppress(Exception):  # (its failure costs only a trim)
                    self.on_release()
        self._arm_release()

    def _after_write(self, nid: int, scope: str, vector: np.ndarray | None) -> None:
        """Keep the in-memory copy in step with a write of this process."""
        if self._index is None:
            if vector is None or not self._counted:
                return  # (the first catch-up counts it)
            from .vectors import VectorIndex

            self._index = VectorIndex(int(vector.shape[0]))
        if vector is None or vector.shape[0] != self._index.dim:
            self._index.remove(nid)
        else:
            self._index.put(nid, scope, vector)
            self._arm_release()

    async def reembed(self, *, everything: bool = False, batch: int = 256) -> int:
        """Embed the notes whose vector is missing or of another model (all with
        ``everything``) with the configured embedder; returns how many.

        Deleted notes lose their vectors.  Afterwards searches use vectors again.
        """
        if self.embedder is None:
            raise NoteError("no embedding model is configured ([memory] embeddings)")
        model = self.embedder.model
        cond = "" if everything else " AND (v.note_id IS NULL OR v.model != ? OR v.dim != ?)"
        params: tuple[Any, ...] = () if everything else (model, self.embedder.dim or -1)
        rows = await self.store.run_read(
            "SELECT n.id, n.text FROM memory_note n LEFT JOIN memory_vector v ON v.note_id = n.id"
            f" WHERE n.deleted = 0{cond} ORDER BY n.id",
            params,
        )
        done = 0
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            vectors = await self.embedder.embed([r[1] for r in chunk])

            def fn(conn: sqlite3.Connection, chunk: Any = chunk, vectors: Any = vectors) -> None:
                for (nid, text), vec in zip(chunk, vectors, strict=True):
                    # Only if the text did not change meanwhile (an edit embeds itself).
                    row = conn.execute(
                        "SELECT text FROM memory_note WHERE id = ? AND deleted = 0", (nid,)
                    ).fetchone()
                    if row is not None and row[0] == text:
                        self._write_vector(conn, nid, vec)

            await self._write(fn)
            done += len(chunk)

        def clean(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM memory_vector WHERE model != ?"
                " OR note_id IN (SELECT id FROM memory_note WHERE deleted = 1)",
                (model,),
            )

        await self._write(clean)
        self._index, self._seq, self._synced_at = None, 0, float("-inf")
        self._counted = False
        await self.check_vectors()
        return done

    # -- writes (run in the store's writer thread) ---------------------------------------
    async def save(
        self, scope: str, text: str, *, author: str | None = None, note_id: int | None = None
    ) -> Note:
        valid_scope(scope)
        text = self.scrub(text)
        now = time.time()
        vector = await self._embed(text)

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
            self._write_vector(conn, nid, vector)
            return _note(
                conn.execute(f"SELECT {_COLUMNS} FROM memory_note WHERE id = ?", (nid,)).fetchone()
            )

        note: Note = await self._write(fn)
        self._after_write(note.id, note.scope, vector)
        return note

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
            conn.execute("DELETE FROM memory_vector WHERE note_id = ?", (note_id,))
            return True

        deleted = bool(await self._write(fn))
        if deleted and self._index is not None:
            self._index.remove(note_id)
        return deleted

    async def restore(self, note_id: int, version: int, *, author: str | None = None) -> Note:
        now = time.time()
        vector: np.ndarray | None = None
        if self.embedder is not None:
            old_rows = await self.store.run_read(
                "SELECT text FROM memory_version WHERE note_id = ? AND version = ?",
                (note_id, version),
            )
            if old_rows:
                vector = await self._embed(old_rows[0][0])

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
            self._write_vector(conn, note_id, vector)
            return _note(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM memory_note WHERE id = ?", (note_id,)
                ).fetchone()
            )

        note: Note = await self._write(fn)
        self._after_write(note.id, note.scope, vector)
        return note

    async def purge(self, note_id: int) -> bool:
        def fn(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM memory_note WHERE id = ?", (note_id,)).rowcount > 0

        purged = bool(await self._write(fn))
        if self._index is not None:
            self._index.remove(note_id)
        return purged

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
        return [n for n, _ in await self.search_scored(query, scopes, limit=limit)]

    async def search_scored(
        self,
        query: str,
        scopes: Sequence[str] | None = None,
        *,
        limit: int = 10,
        mode: SearchMode | None = None,
    ) -> builtins.list[tuple[Note, float]]:
        """Like :meth:`search`, with each note's score: the fused RRF score
        (``hybrid``), the cosine similarity (``vector``) or ``-bm25`` (``fts``)."""
        if scopes is not None and not scopes:
            return []
        mode = mode or self.search_mode
        if mode != "fts" and not self.vectors_ready:
            mode = "fts"
        if mode == "fts" or not query.strip():
            return await self._fts(query, scopes, limit)
        pool = max(limit, CANDIDATES)
        index = await self._sync()
        vec: list[tuple[int, float]] = []
        if index is not None and index.count(scopes):  # else no vector to rank: no embedding
            qvec = await self._query_vector(query)
            if qvec is None:
                return await self._fts(query, scopes, limit)
            await self._warm(index, scopes)
            vec = index.search(qvec, scopes, pool + 8)
        if mode == "vector":
            ranked = vec
        else:
            fts_ids = await self._fts_ids(content_words(query), scopes, pool)
            ranked = rrf(fts_ids, [nid for nid, _ in vec])
        return await self._notes(ranked, scopes, limit)

    async def _query_vector(self, query: str) -> np.ndarray | None:
        if not query.strip():
            return None
        return await self._embed(query)

    async def recall(
        self, query: str, scopes: Sequence[str], *, k: int = 3, min_score: float = 0.0
    ) -> builtins.list[tuple[Note, float]]:
        """The notes most relevant to ``query`` in ``scopes`` for automatic
        recall: hybrid-ranked, each with its cosine similarity to ``query``,
        only those at or above ``min_score``; at most ``k``.  Empty without
        usable vectors (a similarity threshold needs them)."""
        if not scopes or k <= 0 or not self.vectors_ready or not query.strip():
            return []
        index = await self._sync()
        if index is None or not index.count(scopes):
            return []  # no note with a vector is visible: nothing to embed the query for
        qvec = await self._query_vector(query)
        if qvec is None:
            return []
        await self._warm(index, scopes)
        vec = index.search(qvec, scopes, CANDIDATES)
        if not vec or vec[0][1] < min_score:
            # Every candidate needs a vector this close, and none is: no reads.
            return []
        fts_ids = await self._fts_ids(content_words(query), scopes, CANDIDATES)
        fused = rrf(fts_ids, [nid for nid, _ in vec])
        cosines = dict(vec)
        keep: list[tuple[int, float]] = []
        for nid, _ in fused:
            cos = cosines.get(nid)
            if cos is None:
                v = index.vector(nid)
                if v is None:
                    continue
                cos = float(v @ qvec)
            if cos >= min_score:
                keep.append((nid, cos))
        return await self._notes(keep, scopes, k)

    async def _notes(
        self, ranked: Sequence[tuple[int, float]], scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[tuple[Note, float]]:
        """The live notes of ``ranked`` (checked against the table: deleted or
        out-of-scope ones are dropped), in order, at most ``limit``."""
        out: list[tuple[Note, float]] = []
        pos = 0
        while len(out) < limit and pos < len(ranked):
            chunk = ranked[pos : pos + max(limit * 2, 16)]
            pos += len(chunk)
            ids = [nid for nid, _ in chunk]
            where = [f"id IN ({', '.join('?' * len(ids))})", "deleted = 0"]
            params: list[Any] = list(ids)
            if scopes is not None:
                where.append(f"scope IN ({', '.join('?' * len(scopes))})")
                params.extend(scopes)
            rows = await self.store.run_read(
                f"SELECT {_COLUMNS} FROM memory_note WHERE {' AND '.join(where)}", params
            )
            found = {r[0]: _note(r) for r in rows}
            for nid, score in chunk:
                if nid in found and len(out) < limit:
                    out.append((found[nid], score))
        return out

    async def _fts_ids(
        self, query: str, scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[int]:
        """The full-text ranking's note ids, from the index alone (the scopes are
        in the FTS query; deleted notes, still indexed, are dropped by :meth:`_notes`)."""
        match = fts_query(query, scopes)
        if match is None:
            return []
        rows = await self.store.run_read(
            "SELECT rowid FROM memory_fts WHERE memory_fts MATCH ?"
            " ORDER BY bm25(memory_fts, 1.0, 0.0) LIMIT ?",
            (match, limit),
        )
        return [int(r[0]) for r in rows]

    async def _fts(
        self, query: str, scopes: Sequence[str] | None, limit: int
    ) -> builtins.list[tuple[Note, float]]:
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
            f"SELECT {cols}, bm25(memory_fts, 1.0, 0.0) AS rank FROM memory_fts"
            " JOIN memory_note n ON n.id = memory_fts.rowid"
            f" WHERE {' AND '.join(where)} ORDER BY rank, n.id DESC LIMIT ?",
            (*params, limit),
        )
        return [(_note(r[:8]), -float(r[8])) for r in rows]

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
