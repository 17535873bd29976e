"""An in-memory matrix of note vectors, searched by brute force with numpy.

The vectors live in the database (``memory_vector``); this is the copy a
process searches.  One matrix per scope (a channel's, a user's), so a search
is one matrix-vector product over the rows of the visible scopes — a few
milliseconds for 100,000 notes of 256 dimensions — with no approximation:
what it returns is exactly the top cosine similarities.

Only the scopes in use stay in memory.  A scope no search and no write used
since a moment (:meth:`VectorIndex.release_idle`) is *cold*: its matrix is
freed and only an upper bound of its vector count is kept, so a bot that
learned notes in thousands of channels holds the vectors of the channels that
talk, not of every note it ever wrote.  The memory backend reads a cold
scope's vectors back from the database before it searches it
(:meth:`~VectorIndex.begin_load`, :meth:`~VectorIndex.install`); writes that
land while that read is under way are kept aside and applied on top of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["VectorIndex"]


#: Rows a scope's matrix starts with (then doubled as it fills).
FIRST_ROWS = 4


class _Block:
    """The vectors of one scope: rows ``0..n-1`` of a growing matrix.

    It starts at :data:`FIRST_ROWS` rows and doubles: most scopes (one per
    channel and user) hold a handful of notes, and a bot sees thousands of
    them, so a first block of 64 rows (64 KB at 256 dimensions) cost each
    channel with a note 64 KB of memory for good.
    """

    __slots__ = ("ids", "n", "row", "used", "vectors")

    def __init__(self, dim: int) -> None:
        self.vectors = np.zeros((0, dim), dtype=np.float32)
        self.ids = np.zeros(0, dtype=np.int64)
        self.n = 0
        self.row: dict[int, int] = {}
        #: When a search or a write last used it (``time.monotonic()``).
        self.used = time.monotonic()

    def put(self, note_id: int, vector: np.ndarray) -> None:
        row = self.row.get(note_id)
        if row is None:
            if self.n == self.vectors.shape[0]:
                new = max(FIRST_ROWS, self.n * 2)
                vectors = np.zeros((new, self.vectors.shape[1]), dtype=np.float32)
                vectors[: self.n] = self.vectors[: self.n]
                ids = np.zeros(new, dtype=np.int64)
                ids[: self.n] = self.ids[: self.n]
                self.vectors, self.ids = vectors, ids
            row = self.n
            self.n += 1
            self.row[note_id] = row
            self.ids[row] = note_id
        self.vectors[row] = vector

    def fill(self, ids: Sequence[int], vectors: np.ndarray) -> None:
        """Start from ``vectors``, one row per id of ``ids`` (distinct: note ids
        as the database holds them)."""
        self.vectors = np.array(vectors, dtype=np.float32, order="C")
        self.ids = np.array(ids, dtype=np.int64)
        self.row = {int(nid): i for i, nid in enumerate(ids)}
        self.n = len(ids)

    def remove(self, note_id: int) -> None:
        row = self.row.pop(note_id)
        last = self.n - 1
        if row != last:
            moved = int(self.ids[last])
            self.vectors[row] = self.vectors[last]
            self.ids[row] = moved
            self.row[moved] = row
        self.n = last


class VectorIndex:
    """Unit vectors of ``dim`` dimensions keyed by note id, each in a scope.

    Each scope's vectors are one contiguous matrix, so a search costs what the
    visible scopes hold, however many notes other channels have.  A scope is
    *warm* (its matrix is here) or *cold* (released: only an upper bound of
    how many vectors it has is kept); :meth:`search` and :meth:`vector` see
    warm scopes only, so a caller loads the cold ones it needs first.
    """

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._blocks: dict[str, _Block] = {}
        self._scope_of: dict[int, str] = {}
        #: Cold scopes: at least how many vectors each holds (never fewer).
        self._cold: dict[str, int] = {}
        #: Scopes being read back: the writes that landed meanwhile, by note
        #: (``None``: removed), applied over what the read returns.
        self._loading: dict[str, dict[int, np.ndarray | None]] = {}

    def __len__(self) -> int:
        """How many vectors are in memory (warm scopes)."""
        return len(self._scope_of)

    def __contains__(self, note_id: object) -> bool:
        return note_id in self._scope_of

    def put(self, note_id: int, scope: str, vector: np.ndarray) -> None:
        """Add or replace ``note_id``'s vector (moving it if its scope changed).

        In a cold scope nothing is kept but the count: the database has the
        vector, and the scope's next load reads it."""
        old = self._scope_of.get(note_id)
        if old is not None and old != scope:
            self.remove(note_id)
        for name, pending in self._loading.items():
            if name == scope:
                pending[note_id] = vector
            elif note_id in pending or old is None:
                pending[note_id] = None  # wherever it was, it is in ``scope`` now
        if scope in self._loading:
            return
        if scope in self._cold:
            self._cold[scope] += 1
            return
        block = self._blocks.get(scope)
        if block is None:
            block = self._blocks[scope] = _Block(self.dim)
        block.put(note_id, vector)
        block.used = time.monotonic()
        self._scope_of[note_id] = scope

    def put_many(self, ids: Sequence[int], scopes: Sequence[str], vectors: np.ndarray) -> None:
        for nid, scope, vec in zip(ids, scopes, vectors, strict=True):
            self.put(int(nid), scope, vec)

    def remove(self, note_id: int) -> None:
        """Forget ``note_id`` (nothing if absent)."""
        scope = self._scope_of.pop(note_id, None)
        if scope is None:
            # Maybe in a scope being read back: not there once it is loaded.
            for pending in self._loading.values():
                pending[note_id] = None
            return
        block = self._blocks[scope]
        block.remove(note_id)
        if not block.n:  # a scope whose notes are all gone keeps no matrix
            del self._blocks[scope]

    def count(self, scopes: Sequence[str] | None = None) -> int:
        """How many vectors ``scopes`` hold (all scopes when ``None``); for a
        cold scope, an upper bound (0 only when it has none)."""
        if scopes is None:
            return len(self._scope_of) + sum(self._cold.values())
        total = 0
        for s in dict.fromkeys(scopes):
            block = self._blocks.get(s)
            if block is not None:
                total += block.n
            else:
                total += self._cold.get(s, 0)
        return total

    def vector(self, note_id: int) -> np.ndarray | None:
        """``note_id``'s vector, when its scope is warm."""
        scope = self._scope_of.get(note_id)
        if scope is None:
            return None
        block = self._blocks[scope]
        return block.vectors[block.row[note_id]]

    # -- warm and cold scopes ---------------------------------------------------------
    def cold_scopes(self, scopes: Sequence[str] | None) -> list[str]:
        """The scopes of ``scopes`` (all when ``None``) whose vectors are not in
        memory and may hold some: what to load before searching them."""
        if scopes is None:
            return [s for s, n in self._cold.items() if n and s not in self._loading]
        return [s for s in dict.fromkeys(scopes) if self._cold.get(s) and s not in self._loading]

    def add_cold(self, scope: str, count: int) -> None:
        """``scope`` has ``count`` vectors in the database, none here (yet)."""
        if count > 0 and scope not in self._blocks:
            self._cold[scope] = self._cold.get(scope, 0) + count

    def release_idle(self, before: float) -> int:
        """Free the matrix of every scope not used since ``before`` (a
        ``time.monotonic()`` value); it becomes cold.  Returns how many."""
        idle = [name for name, block in self._blocks.items() if block.used < before]
        for name in idle:
            block = self._blocks.pop(name)
            for nid in block.row:
                self._scope_of.pop(nid, None)
            self._cold[name] = block.n
        return len(idle)

    def oldest_use(self) -> float | None:
        """When the least recently used warm scope was used (``None``: none is warm)."""
        return min((b.used for b in self._blocks.values()), default=None)

    def begin_load(self, scopes: Iterable[str]) -> None:
        """``scopes`` (cold) are being read from the database: keep the writes
        that land meanwhile, to apply them over what the read returns."""
        for name in scopes:
            self._loading.setdefault(name, {})

    def abort_load(self, scopes: Iterable[str]) -> None:
        """The read failed: ``scopes`` stay cold (counting the writes kept aside)."""
        for name in scopes:
            pending = self._loading.pop(name, None)
            if pending is not None and name in self._cold:
                self._cold[name] += sum(1 for v in pending.values() if v is not None)

    def install(self, scope: str, ids: Sequence[int], vectors: np.ndarray) -> None:
        """``scope``'s vectors as read from the database (note ``ids``, one row
        of ``vectors`` each), then the writes kept aside since :meth:`begin_load`:
        the scope is warm."""
        block = _Block(self.dim)
        keep = [i for i, nid in enumerate(ids) if self._scope_of.get(nid, scope) == scope]
        if keep:  # (a note moved to a warm scope since is not taken back)
            block.fill([ids[i] for i in keep], vectors[keep] if len(keep) < len(ids) else vectors)
        for nid, kept in self._loading.pop(scope, {}).items():
            if kept is not None:
                block.put(nid, kept)
            elif nid in block.row:
                block.remove(nid)
        self._cold.pop(scope, None)
        if block.n:
            self._blocks[scope] = block
            for nid in block.row:
                self._scope_of[nid] = scope

    def search(
        self, query: np.ndarray, scopes: Sequence[str] | None, limit: int
    ) -> list[tuple[int, float]]:
        """The ``limit`` notes most similar to ``query`` (a unit vector), in
        ``scopes`` (all when ``None``): ``(note id, cosine)``, best first.
        Cold scopes are not searched (load them first)."""
        if limit <= 0:
            return []
        names = self._blocks if scopes is None else dict.fromkeys(scopes)
        now = time.monotonic()
        found_ids: list[np.ndarray] = []
        found_scores: list[np.ndarray] = []
        for name in names:
            block = self._blocks.get(name)
            if block is None or block.n == 0:
                continue
            block.used = now
            scores = block.vectors[: block.n] @ query
            if scores.shape[0] > limit:
                top = np.argpartition(-scores, limit - 1)[:limit]
                found_ids.append(block.ids[top])
                found_scores.append(scores[top])
            else:
                found_ids.append(block.ids[: block.n])
                found_scores.append(scores)
        if not found_ids:
            return []
        ids = np.concatenate(found_ids)
        scores = np.concatenate(found_scores)
        order = np.argsort(-scores, kind="stable")[:limit]
        return [(int(ids[i]), float(scores[i])) for i in order]
